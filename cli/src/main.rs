//! `colocated`: the command line of the colocated runtime.
//!
//! `colocated status [HOST:PORT...]` prints one line per worker (version,
//! devices, sessions, uptime), finding them as a controller does when no
//! address is given, and exits 1 if one does not answer.
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
//! can never make a worker load a library. It serves every session in its own
//! process unless given `--isolate-sessions`: then each session runs in a
//! `colocated worker` process of its own, started for it with the same flags
//! (core's rules, as for the Python and Node workers).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Arg, ArgAction, ArgMatches, Command};
use colocated_core::worker::{
    FlagKind, StatusFlags, Worker, WorkerFlag, WorkerFlags, WorkerKind, STATUS_FLAGS, WORKER_FLAGS,
};
use colocated_core::Client;
use tokio::signal::unix::{signal, Signal, SignalKind};

/// The argument of one flag of core's tables.
fn arg_of(flag: &WorkerFlag) -> Arg {
    let mut arg = Arg::new(flag.name).long(flag.name).help(flag.help);
    arg = match flag.kind {
        FlagKind::Switch => arg.action(ArgAction::SetTrue),
        FlagKind::Count => arg.value_parser(clap::value_parser!(usize)).value_name("N"),
        FlagKind::Seconds => arg
            .value_parser(clap::value_parser!(f64))
            .value_name("SECONDS"),
        FlagKind::Path => arg
            .value_parser(clap::value_parser!(PathBuf))
            .value_name("FILE"),
        FlagKind::Address => arg.value_name("HOST:PORT"),
        FlagKind::Port => arg.value_name("PORT"),
        FlagKind::Name => arg.value_name("NAME"),
    };
    if flag.repeatable {
        arg = arg.action(ArgAction::Append);
    }
    if let Some(default) = flag.default {
        arg = arg.default_value(default);
    }
    arg.aliases(flag.aliases).hide(flag.hidden)
}

/// The command line: `colocated worker` with the flags of [`WORKER_FLAGS`]
/// (the table `python -m colocated.worker` is built from too), and
/// `colocated status` with those of [`STATUS_FLAGS`].
fn command() -> Command {
    let worker = WORKER_FLAGS.iter().fold(
        Command::new("worker").about("Serves this machine's devices to a controller."),
        |worker, flag| worker.arg(arg_of(flag)),
    );
    let status = STATUS_FLAGS.iter().fold(
        Command::new("status")
            .about(
                "One line per worker: version, devices, sessions, uptime. Exits 1 if one does \
                 not answer.",
            )
            .arg(
                Arg::new("addresses")
                    .value_name("HOST:PORT")
                    .num_args(0..)
                    .help("The workers (default: found as --cluster says)."),
            ),
        |status, flag| status.arg(arg_of(flag)),
    );
    Command::new("colocated")
        .version(env!("CARGO_PKG_VERSION"))
        .about("The colocated runtime's command line")
        .subcommand_required(true)
        .subcommand(worker)
        .subcommand(status)
}

/// The status flags' values from parsed `matches`.
fn status_flags(matches: &ArgMatches) -> StatusFlags {
    StatusFlags {
        addresses: matches
            .get_many::<String>("addresses")
            .map(|a| a.cloned().collect())
            .unwrap_or_default(),
        token_file: matches.get_one::<PathBuf>("token-file").cloned(),
        tls_ca: matches.get_one::<PathBuf>("tls-ca").cloned(),
        tls_domain: matches.get_one::<String>("tls-domain").cloned(),
        timeout: matches
            .get_one::<f64>("timeout")
            .copied()
            .unwrap_or_default(),
        cluster: matches
            .get_one::<String>("cluster")
            .cloned()
            .unwrap_or_default(),
        port: matches.get_one::<String>("port").cloned(),
    }
}

/// The worker flags' values from parsed `matches`.
fn worker_flags(matches: &ArgMatches) -> WorkerFlags {
    let path = |name: &str| matches.get_one::<PathBuf>(name).cloned();
    let seconds = |name: &str| matches.get_one::<f64>(name).copied();
    WorkerFlags {
        listen: matches
            .get_one::<String>("listen")
            .cloned()
            .unwrap_or_default(),
        port: matches.get_one::<String>("port").cloned(),
        cpu_devices: matches.get_one::<usize>("cpu-devices").copied(),
        pjrt_plugin: matches
            .get_one::<PathBuf>("pjrt-plugin")
            .map(|p| p.display().to_string()),
        pjrt_options: matches
            .get_many::<String>("pjrt-option")
            .map(|o| o.cloned().collect())
            .unwrap_or_default(),
        token_file: path("token-file"),
        insecure: matches.get_flag("insecure"),
        tls_cert: path("tls-cert"),
        tls_key: path("tls-key"),
        heartbeat_interval: seconds("heartbeat-interval").unwrap_or_default(),
        session_timeout: seconds("session-timeout").unwrap_or_default(),
        plugins: matches
            .get_many::<PathBuf>("plugin")
            .map(|p| p.cloned().collect())
            .unwrap_or_default(),
        exit_after_idle: seconds("exit-after-idle"),
        trace: path("trace"),
        isolate_sessions: matches.get_flag("isolate-sessions"),
        shared_sessions: matches.get_flag("shared-sessions"),
        single_session: matches.get_flag("single-session"),
    }
}

/// `colocated worker` as a kind of worker: this executable, which serves
/// every session in its own process unless given `--isolate-sessions` (it
/// runs no code that controllers send, only its operator's plugins and XLA
/// programs, and a process per session would start a PJRT client per
/// session on the same devices).
fn worker_kind() -> Result<WorkerKind, String> {
    Ok(WorkerKind {
        program: std::env::current_exe()
            .map_err(|e| format!("cannot find this executable to start session workers: {e}"))?,
        args: vec!["worker".into()],
        isolates_by_default: false,
    })
}

/// What a worker logs when `COLOCATED_LOG` is unset: the warnings of the
/// colocated crates (refused requests, an insecure or exposed worker).
const DEFAULT_LOG: &str = "colocated=warn";

fn main() -> ExitCode {
    let matches = command().get_matches();
    let result = match matches.subcommand() {
        Some(("worker", worker)) => {
            let flags = worker_flags(worker);
            colocated_core::trace::init_worker(DEFAULT_LOG, flags.trace_file().as_deref());
            run_worker(flags)
        }
        Some(("status", status)) => {
            colocated_core::trace::init_worker(DEFAULT_LOG, None);
            return match status_flags(status).run() {
                Ok((report, all)) => {
                    print!("{report}");
                    if all {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(1)
                    }
                }
                Err(e) => {
                    eprintln!("colocated: {}", e.message());
                    ExitCode::from(2)
                }
            };
        }
        _ => Err("no such command".to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("colocated: {message}");
            ExitCode::from(2)
        }
    }
}

fn run_worker(args: WorkerFlags) -> Result<(), String> {
    // Every flag checked before anything starts.
    let options = args
        .options(&worker_kind()?)
        .map_err(|e| e.message().to_string())?;
    let client_options = args.client_options().map_err(|e| e.message().to_string())?;
    let client = Client::new_local(client_options).map_err(|e| e.to_string())?;
    for path in &args.plugins {
        let names = colocated_plugin::load_plugin(&client, path).map_err(|e| e.to_string())?;
        tracing::info!(plugin = %path.display(), functions = ?names, "loaded a plugin");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worker_command_takes_every_flag_of_the_table_and_no_other() {
        let command = command();
        let worker = command
            .find_subcommand("worker")
            .expect("a worker subcommand");
        let longs: Vec<&str> = worker
            .get_arguments()
            .filter_map(|a| a.get_long())
            .filter(|l| *l != "help")
            .collect();
        let table: Vec<&str> = WORKER_FLAGS.iter().map(|f| f.name).collect();
        assert_eq!(longs, table);
        let matches = command
            .try_get_matches_from([
                "colocated",
                "worker",
                "--insecure",
                "--plugin",
                "a.so",
                "--plugin",
                "b.so",
            ])
            .unwrap();
        let (_, worker) = matches.subcommand().unwrap();
        let flags = worker_flags(worker);
        assert_eq!(flags.listen, "127.0.0.1:0");
        assert_eq!(
            (flags.heartbeat_interval, flags.session_timeout),
            (1.0, 10.0)
        );
        assert_eq!(
            flags.plugins,
            [PathBuf::from("a.so"), PathBuf::from("b.so")]
        );
        assert!(flags.insecure && flags.token_file.is_none());
    }
}
