//! The flags of `colocated worker`: the table every CLI (Rust, Python, Node)
//! builds its parser from, and the one place their values take effect (the
//! status command's are in `status.rs`); the tokens a command line gives.

use std::path::PathBuf;
use std::time::Duration;

use super::{TlsIdentity, WorkerKind, WorkerOptions};
use crate::error::{Error, Result};
use crate::transport::{Token, TOKEN_ENV};

/// What a flag takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagKind {
    /// No value: present or not.
    Switch,
    /// A `HOST:PORT` address.
    Address,
    /// A non-negative count.
    Count,
    /// A positive, finite number of seconds.
    Seconds,
    /// A file path.
    Path,
    /// A word (a name, a choice).
    Name,
    /// A port number, or `auto` (the Slurm job's, see
    /// [`worker_port`](crate::cluster::worker_port)).
    Port,
}

impl FlagKind {
    /// Its name in SDKs' parsers: `switch`, `address`, `count`, `seconds`,
    /// `path`, `port` or `name`.
    pub fn name(self) -> &'static str {
        match self {
            FlagKind::Switch => "switch",
            FlagKind::Address => "address",
            FlagKind::Count => "count",
            FlagKind::Seconds => "seconds",
            FlagKind::Path => "path",
            FlagKind::Port => "port",
            FlagKind::Name => "name",
        }
    }
}

/// One flag of a worker's command line.
#[derive(Clone, Copy, Debug)]
pub struct WorkerFlag {
    /// The long name, without `--`.
    pub name: &'static str,
    /// What it takes.
    pub kind: FlagKind,
    /// The default value as text (`None`: unset, or off for a switch).
    pub default: Option<&'static str>,
    /// True when it may be given several times (each adds a value).
    pub repeatable: bool,
    /// The help text.
    pub help: &'static str,
    /// Other names it is also given by, without `--`.
    pub aliases: &'static [&'static str],
    /// True for a flag that help leaves out: for workers to start each
    /// other, not for operators.
    pub hidden: bool,
}

pub(super) const fn flag(name: &'static str, kind: FlagKind, help: &'static str) -> WorkerFlag {
    WorkerFlag {
        name,
        kind,
        default: None,
        repeatable: false,
        help,
        aliases: &[],
        hidden: false,
    }
}

/// The flags every worker command line takes, in help order.
pub const WORKER_FLAGS: &[WorkerFlag] = &[
    WorkerFlag {
        default: Some("127.0.0.1:0"),
        ..flag(
            "listen",
            FlagKind::Address,
            "Address to listen on; port 0 picks a free port.",
        )
    },
    flag(
        "port",
        FlagKind::Port,
        "Listen on this port of --listen's address instead; auto: the Slurm job's \
         (61440 + SLURM_JOB_ID % 4096), the port controllers of the job look for.",
    ),
    flag(
        "cpu-devices",
        FlagKind::Count,
        "Number of CPU devices to serve (default: the number of cores).",
    ),
    flag(
        "pjrt-plugin",
        FlagKind::Path,
        "Serve this PJRT plugin's devices beside the CPU devices: the plugin library \
         (pjrt_c_api_cpu_plugin.so, xla_cuda_plugin.so) or a name in PJRT_NAMES_AND_LIBRARY_PATHS \
         (default: COLOCATED_PJRT_PLUGIN). XLA programs compile and run on them here. \
         Controllers cannot load plugins.",
    ),
    WorkerFlag {
        repeatable: true,
        ..flag(
            "pjrt-option",
            FlagKind::Name,
            "KEY=VALUE: a create option of the --pjrt-plugin client (an integer, a number, \
             true or false, or text), such as cpu_device_count=4. Repeatable.",
        )
    },
    flag(
        "token-file",
        FlagKind::Path,
        "File holding the token every request must carry (default: the COLOCATED_TOKEN environment variable).",
    ),
    flag(
        "insecure",
        FlagKind::Switch,
        "Serve without a token: anyone who reaches the address can run code here.",
    ),
    flag(
        "tls-cert",
        FlagKind::Path,
        "Serve TLS with this PEM certificate chain (with --tls-key).",
    ),
    flag("tls-key", FlagKind::Path, "The PEM private key of --tls-cert."),
    WorkerFlag {
        default: Some("1"),
        ..flag(
            "heartbeat-interval",
            FlagKind::Seconds,
            "Seconds between the heartbeats controllers are asked to send.",
        )
    },
    WorkerFlag {
        default: Some("10"),
        ..flag(
            "session-timeout",
            FlagKind::Seconds,
            "Seconds without a heartbeat after which a session is closed and its resources freed.",
        )
    },
    WorkerFlag {
        repeatable: true,
        ..flag(
            "plugin",
            FlagKind::Path,
            "Load this plugin library at start: a shared library exporting colocated_plugin_init \
             (see colocated.h) that registers the native functions programs may call here. \
             Repeatable. Controllers cannot load plugins.",
        )
    },
    flag(
        "exit-after-idle",
        FlagKind::Seconds,
        "Exit (status 0) once the worker has had no session for this many seconds, counted from \
         its start and from the end of its last session: a worker orphaned by its launcher or \
         controller goes away by itself.",
    ),
    flag(
        "isolate-sessions",
        FlagKind::Switch,
        "Run each session in a worker process of its own, started for it with this \
         worker's devices, plugins, liveness, TLS and trace flags and a one-time token, so that \
         one controller's code cannot reach another's objects. The default of the workers that \
         run code controllers send (python -m colocated.worker, the Node package's colocated \
         worker); colocated worker, which runs native functions only, serves every session in \
         one process unless given this.",
    ),
    WorkerFlag {
        aliases: &["shared-interpreter"],
        ..flag(
            "shared-sessions",
            FlagKind::Switch,
            "Serve every session in this process: their programs share one interpreter or event \
             loop (the default of colocated worker). --shared-interpreter is the same switch.",
        )
    },
    WorkerFlag {
        hidden: true,
        ..flag(
            "single-session",
            FlagKind::Switch,
            "Serve one session, then exit 0 (also when none opens within the handshake deadline, \
             or when stdin closes): a supervisor's session worker. Its --token-file holds a \
             one-time token, read once and deleted.",
        )
    },
    flag(
        "trace",
        FlagKind::Path,
        "Write this worker's own Chrome/Perfetto trace to this file. Without it the worker \
         writes none (it ignores COLOCATED_TRACE, which names the controller's file) and sends \
         its spans to each controller that traces.",
    ),
];

/// The values of [`WORKER_FLAGS`], as a parser gives them (text as typed;
/// [`WorkerFlags::options`] checks it).
#[derive(Clone, Debug, Default)]
pub struct WorkerFlags {
    /// `--listen`.
    pub listen: String,
    /// `--port`.
    pub port: Option<String>,
    /// `--cpu-devices`.
    pub cpu_devices: Option<usize>,
    /// `--pjrt-plugin`: a library path or a name (see [`crate::find_plugin`]).
    pub pjrt_plugin: Option<String>,
    /// `--pjrt-option`, each (`KEY=VALUE`).
    pub pjrt_options: Vec<String>,
    /// `--token-file`.
    pub token_file: Option<PathBuf>,
    /// `--insecure`.
    pub insecure: bool,
    /// `--tls-cert`.
    pub tls_cert: Option<PathBuf>,
    /// `--tls-key`.
    pub tls_key: Option<PathBuf>,
    /// `--heartbeat-interval`.
    pub heartbeat_interval: f64,
    /// `--session-timeout`.
    pub session_timeout: f64,
    /// `--plugin`, each.
    pub plugins: Vec<PathBuf>,
    /// `--exit-after-idle`.
    pub exit_after_idle: Option<f64>,
    /// `--trace`: the worker's own trace file (the caller passes
    /// [`WorkerFlags::trace_file`] to [`crate::trace::init_worker`] before
    /// anything else starts).
    pub trace: Option<PathBuf>,
    /// `--isolate-sessions`.
    pub isolate_sessions: bool,
    /// `--shared-sessions` (or `--shared-interpreter`).
    pub shared_sessions: bool,
    /// `--single-session`.
    pub single_session: bool,
}

/// A PJRT create option given as `KEY=VALUE`: an integer, a number, `true`
/// or `false`, else text. `invalid_argument` without `=` or a key.
pub fn parse_pjrt_option(text: &str) -> Result<(String, crate::PjrtValue)> {
    use crate::PjrtValue;
    let (key, value) = text
        .split_once('=')
        .filter(|(k, _)| !k.trim().is_empty())
        .ok_or_else(|| Error::invalid_argument(format!("PJRT option {text:?} is not KEY=VALUE")))?;
    let value = if let Ok(i) = value.parse::<i64>() {
        PjrtValue::Int64(i)
    } else if let Ok(f) = value.parse::<f32>() {
        PjrtValue::Float(f)
    } else if value == "true" || value == "false" {
        PjrtValue::Bool(value == "true")
    } else {
        PjrtValue::String(value.to_string())
    };
    Ok((key.trim().to_string(), value))
}

/// A positive, finite number of seconds given as option `name` (a flag, a
/// keyword argument), or `invalid_argument` naming it.
pub fn seconds(name: &str, value: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "{name} must be a positive number of seconds, not {value}"
            ))
        })
}

impl WorkerFlags {
    /// The options of the client the worker serves: `--cpu-devices` CPU
    /// devices and the `--pjrt-plugin` (else `COLOCATED_PJRT_PLUGIN`'s)
    /// devices with `--pjrt-option`s. `invalid_argument` naming the flag;
    /// `not_found` for a plugin name that is not known.
    pub fn client_options(&self) -> Result<crate::ClientOptions> {
        let options = self
            .pjrt_options
            .iter()
            .map(|o| parse_pjrt_option(o))
            .collect::<Result<Vec<_>>>()?;
        let pjrt = match &self.pjrt_plugin {
            Some(spec) => crate::PjrtOptions::of(Some(spec), options)
                .map_err(|e| e.context("--pjrt-plugin"))?,
            None => match crate::plugin_from_env()? {
                Some(from_env) => Some(crate::PjrtOptions {
                    options,
                    ..from_env
                }),
                None if options.is_empty() => None,
                None => {
                    return Err(Error::invalid_argument(
                        "--pjrt-option needs --pjrt-plugin (or COLOCATED_PJRT_PLUGIN)",
                    ))
                }
            },
        };
        Ok(crate::ClientOptions {
            num_cpu_devices: self.cpu_devices,
            pjrt,
            ..Default::default()
        })
    }

    /// The options of a worker of `kind`: the token by the worker's rule
    /// ([`Token::for_worker`]; with `--single-session`, the one-time token
    /// of `--token-file`, whose file is then deleted), the address parsed,
    /// the seconds checked, the TLS files read, and sessions isolated as
    /// `--isolate-sessions`, `--shared-sessions` and the kind's default say
    /// (see [`WorkerKind`]). `invalid_argument` naming the flag.
    /// (`--cpu-devices` and `--plugin` shape the client the worker serves:
    /// the caller applies them.)
    pub fn options(&self, kind: &WorkerKind) -> Result<WorkerOptions> {
        let isolate = self.isolation(kind)?;
        let token = if self.single_session {
            Some(self.one_time_token()?)
        } else {
            Token::for_worker(self.token_file.as_deref(), self.insecure)?
        };
        let mut options = WorkerOptions::new(token);
        options.isolate = isolate;
        options.single_session = self.single_session;
        options.listen = self.listen.parse().map_err(|e| {
            Error::invalid_argument(format!("--listen {:?} is not HOST:PORT: {e}", self.listen))
        })?;
        if let Some(port) = &self.port {
            let port = crate::cluster::worker_port(port, &crate::cluster::System)?;
            options.listen.set_port(port);
        }
        options.heartbeat_interval = seconds("--heartbeat-interval", self.heartbeat_interval)?;
        options.session_timeout = seconds("--session-timeout", self.session_timeout)?;
        options.exit_after_idle = self
            .exit_after_idle
            .map(|s| seconds("--exit-after-idle", s))
            .transpose()?;
        options.tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                let read = |path: &PathBuf| {
                    std::fs::read(path).map_err(|e| {
                        Error::invalid_argument(format!("cannot read {}: {e}", path.display()))
                    })
                };
                Some(TlsIdentity {
                    cert_pem: read(cert)?,
                    key_pem: read(key)?,
                })
            }
            (None, None) => None,
            _ => {
                return Err(Error::invalid_argument(
                    "--tls-cert and --tls-key go together",
                ))
            }
        };
        Ok(options)
    }
}

impl Token {
    /// The token a controller presents: `text`, else the file `file`, else
    /// `COLOCATED_TOKEN`; `None` when there is none. `invalid_argument` for
    /// both `text` and `file`, an unreadable file or an empty token.
    pub fn resolve(text: Option<&str>, file: Option<&std::path::Path>) -> Result<Option<Token>> {
        match (text, file) {
            (Some(_), Some(_)) => Err(Error::invalid_argument(
                "give a token or a token file, not both",
            )),
            (Some(text), None) => Token::new(text).map(Some),
            (None, Some(path)) => Token::from_file(path).map(Some),
            (None, None) => Token::from_env(),
        }
    }

    /// The token a worker requires: the one in `file`, else
    /// `COLOCATED_TOKEN`'s; `None` only when `insecure` (which ignores the
    /// environment). `invalid_argument` for a file with `insecure`, and for
    /// no token without `insecure`, saying how to give one.
    pub fn for_worker(file: Option<&std::path::Path>, insecure: bool) -> Result<Option<Token>> {
        match (file, insecure) {
            (Some(_), true) => Err(Error::invalid_argument(
                "--token-file and --insecure exclude each other",
            )),
            (Some(path), false) => Token::from_file(path).map(Some),
            (None, true) => Ok(None),
            (None, false) => Token::from_env()?.map(Some).ok_or_else(|| {
                Error::invalid_argument(format!(
                    "a worker requires a token: pass --token-file FILE or set {TOKEN_ENV} \
                     (--insecure serves anyone, which lets them run code on this machine)"
                ))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    fn kind() -> WorkerKind {
        WorkerKind {
            program: "/bin/worker".into(),
            args: vec!["worker".into()],
            isolates_by_default: false,
        }
    }

    fn flags() -> WorkerFlags {
        WorkerFlags {
            listen: "127.0.0.1:0".into(),
            insecure: true,
            heartbeat_interval: 1.0,
            session_timeout: 10.0,
            ..Default::default()
        }
    }

    #[test]
    fn the_table_names_each_flag_once_with_help() {
        let mut names = std::collections::HashSet::new();
        for f in WORKER_FLAGS {
            assert!(!f.help.is_empty(), "{}", f.name);
            for name in std::iter::once(&f.name).chain(f.aliases) {
                assert!(names.insert(*name), "{name} twice");
            }
        }
    }

    #[test]
    fn bad_values_are_refused_naming_the_flag() {
        let cases: [(&str, WorkerFlags); 7] = [
            (
                "--isolate-sessions and --shared-sessions",
                WorkerFlags {
                    isolate_sessions: true,
                    shared_sessions: true,
                    ..flags()
                },
            ),
            (
                "--single-session needs --token-file",
                WorkerFlags {
                    single_session: true,
                    ..flags()
                },
            ),
            (
                "--listen",
                WorkerFlags {
                    listen: "nowhere".into(),
                    ..flags()
                },
            ),
            (
                "--heartbeat-interval",
                WorkerFlags {
                    heartbeat_interval: 0.0,
                    ..flags()
                },
            ),
            (
                "--session-timeout",
                WorkerFlags {
                    session_timeout: f64::NAN,
                    ..flags()
                },
            ),
            (
                "--exit-after-idle",
                WorkerFlags {
                    exit_after_idle: Some(-1.0),
                    ..flags()
                },
            ),
            (
                "--tls-cert and --tls-key",
                WorkerFlags {
                    tls_cert: Some("c.pem".into()),
                    ..flags()
                },
            ),
        ];
        for (name, bad) in cases {
            let err = bad.options(&kind()).unwrap_err();
            assert_eq!(err.code(), ErrorCode::InvalidArgument);
            assert!(err.message().contains(name), "{name}: {err}");
        }
        let options = flags().options(&kind()).unwrap();
        assert!(options.token.is_none());
        assert_eq!(options.session_timeout, Duration::from_secs(10));
    }

    #[test]
    fn a_worker_token_comes_from_its_file_and_insecure_excludes_one() {
        let dir = std::env::temp_dir().join(format!("colocated-flags-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "s3cret\n").unwrap();
        let token = Token::for_worker(Some(&file), false).unwrap().unwrap();
        assert!(token.matches("s3cret"));
        let err = Token::for_worker(Some(&file), true).unwrap_err();
        assert!(err.message().contains("exclude each other"), "{err}");
        assert!(Token::for_worker(None, true).unwrap().is_none());
        let err = Token::resolve(Some("a"), Some(&file)).unwrap_err();
        assert!(err.message().contains("not both"), "{err}");
        assert!(Token::resolve(None, Some(&file))
            .unwrap()
            .unwrap()
            .matches("s3cret"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
