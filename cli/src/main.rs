//! `colocated`: the command line of the colocated runtime.
//!
//! `colocated worker` serves this machine's devices to a controller over gRPC
//! (SPEC §6). It prints exactly one line, `listening on HOST:PORT`, to stdout
//! once it accepts connections, logs to stderr (`COLOCATED_LOG`; by default
//! warnings, such as refused requests and an exposed insecure worker), and
//! stops cleanly (status 0) on SIGINT or SIGTERM, or with `--exit-after-idle`
//! once it has had no session for that long; it catches both signals before it
//! binds its port, so a signal sent as soon as the line appears stops it
//! cleanly too. Its native functions come from the plugin libraries its
//! operator names with `--plugin`, loaded before it serves anyone: a controller
//! can never make a worker load a library.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use colocated_core::transport::worker::{TlsIdentity, Worker, WorkerOptions};
use colocated_core::transport::Token;
use colocated_core::{Client, ClientOptions};
use tokio::signal::unix::{signal, Signal, SignalKind};

#[derive(Parser)]
#[command(
    name = "colocated",
    version,
    about = "The colocated runtime's command line"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serves this machine's devices to a controller.
    Worker(WorkerArgs),
}

#[derive(clap::Args)]
struct WorkerArgs {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Number of CPU devices to serve (default: the number of cores).
    #[arg(long)]
    cpu_devices: Option<usize>,
    /// File holding the token every request must carry (default: the
    /// COLOCATED_TOKEN environment variable).
    #[arg(long, conflicts_with = "insecure")]
    token_file: Option<PathBuf>,
    /// Serve without a token: anyone who reaches the address can run code here.
    #[arg(long)]
    insecure: bool,
    /// Serve TLS with this PEM certificate chain (with --tls-key).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Seconds between the heartbeats controllers are asked to send.
    #[arg(long, default_value_t = 1.0)]
    heartbeat_interval: f64,
    /// Seconds without a heartbeat after which a session is closed and its
    /// resources freed.
    #[arg(long, default_value_t = 10.0)]
    session_timeout: f64,
    /// Load this plugin library at start: a shared library exporting
    /// colocated_plugin_init (see colocated.h) that registers the native
    /// functions programs may call here. Repeatable. Controllers cannot load
    /// plugins.
    #[arg(long = "plugin", value_name = "LIB")]
    plugins: Vec<PathBuf>,
    /// Exit (status 0) once the worker has had no session for this many
    /// seconds, counted from its start and from the end of its last session
    /// (closed, timed out or dropped): a worker orphaned by its launcher or
    /// controller goes away by itself.
    #[arg(long, value_name = "SECONDS")]
    exit_after_idle: Option<f64>,
}

/// What a worker logs when `COLOCATED_LOG` is unset: the warnings of the
/// colocated crates (refused requests, an insecure or exposed worker).
const DEFAULT_LOG: &str = "colocated=warn";

fn main() -> ExitCode {
    colocated_core::trace::init_with_default_log(DEFAULT_LOG);
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Worker(args) => run_worker(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("colocated: {message}");
            ExitCode::from(2)
        }
    }
}

fn seconds(name: &str, value: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("--{name} must be a positive number of seconds"))
}

fn run_worker(args: WorkerArgs) -> Result<(), String> {
    let token = match (&args.token_file, args.insecure) {
        (Some(path), _) => Some(Token::from_file(path).map_err(|e| e.to_string())?),
        (None, true) => None,
        (None, false) => Some(Token::from_env().map_err(|e| e.to_string())?.ok_or(
            "a worker requires a token: pass --token-file FILE or set COLOCATED_TOKEN \
                        (--insecure serves anyone, which lets them run code on this machine)",
        )?),
    };
    let client = Client::new_local(ClientOptions {
        num_cpu_devices: args.cpu_devices,
        executor_threads: None,
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    for path in &args.plugins {
        let names = colocated_plugin::load_plugin(&client, path).map_err(|e| e.to_string())?;
        tracing::info!(plugin = %path.display(), functions = ?names, "loaded a plugin");
    }
    let mut options = WorkerOptions::new(token);
    options.listen = args.listen;
    options.heartbeat_interval = seconds("heartbeat-interval", args.heartbeat_interval)?;
    options.session_timeout = seconds("session-timeout", args.session_timeout)?;
    options.exit_after_idle = args
        .exit_after_idle
        .map(|s| seconds("exit-after-idle", s))
        .transpose()?;
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
        };
        options.tls = Some(TlsIdentity {
            cert_pem: read(cert)?,
            key_pem: read(key)?,
        });
    }
    // Before the port is bound and the line printed: a launcher may stop the
    // worker as soon as it sees either, and the worker must then stop cleanly
    // instead of dying of the signal.
    let termination = Termination::catch()?;
    let worker = Worker::start(client, options).map_err(|e| e.to_string())?;
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "listening on {}", worker.local_addr())
            .and_then(|()| stdout.flush())
            .map_err(|e| format!("cannot write to stdout: {e}"))?;
    }
    if let Stop::Idle = termination.wait(worker.wait_idle_expired()) {
        if let Some(limit) = args.exit_after_idle {
            eprintln!("colocated: no session for {limit} s (--exit-after-idle): stopping");
        }
    }
    tracing::info!("stopping");
    worker.shutdown().map_err(|e| e.to_string())
}

/// SIGINT and SIGTERM, caught instead of ending the process from the moment
/// [`Termination::catch`] returns.
struct Termination {
    runtime: tokio::runtime::Runtime,
    interrupt: Signal,
    terminate: Signal,
}

impl Termination {
    /// Installs the handlers of SIGINT and SIGTERM; a signal that arrives from
    /// now on is kept for [`Termination::wait`].
    fn catch() -> Result<Termination, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot wait for signals: {e}"))?;
        let catch = |kind: SignalKind, name: &str| {
            let _context = runtime.enter();
            signal(kind).map_err(|e| format!("cannot catch {name}: {e}"))
        };
        let interrupt = catch(SignalKind::interrupt(), "SIGINT")?;
        let terminate = catch(SignalKind::terminate(), "SIGTERM")?;
        Ok(Termination {
            runtime,
            interrupt,
            terminate,
        })
    }

    /// Blocks until SIGINT or SIGTERM, or until `idle` resolves; returns at
    /// once if a signal arrived since [`Termination::catch`].
    fn wait(self, idle: impl std::future::Future<Output = ()>) -> Stop {
        let Termination {
            runtime,
            mut interrupt,
            mut terminate,
        } = self;
        runtime.block_on(async {
            tokio::select! {
                biased;
                _ = interrupt.recv() => Stop::Signal,
                _ = terminate.recv() => Stop::Signal,
                () = idle => Stop::Idle,
            }
        })
    }
}

/// Why a worker stops.
enum Stop {
    /// SIGINT or SIGTERM.
    Signal,
    /// It had no session for `--exit-after-idle` seconds.
    Idle,
}
