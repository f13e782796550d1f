//! A Node worker: this process serving its devices to controllers, running
//! `node` programs on its event loop and native plugins (`npx colocated
//! worker`, in `bin/colocated.js`), by default each session in a Node worker
//! process of its own. Its flags are core's table, which every worker's
//! parser is built from; their values become options by core's rules.

use std::sync::Mutex;

use colocated_core as core;
use core::worker::{Worker, WorkerFlags, WorkerKind, WORKER_FLAGS};
use napi::bindgen_prelude::AsyncTask;
use napi::{Env, Task};
use napi_derive::napi;

use crate::client::with_node;
use crate::errors::OrThrow;

/// One flag of a worker's command line (core's table).
#[napi(object)]
pub struct WorkerFlagInfo {
    /// The long name, without `--`.
    pub name: String,
    /// `switch`, `address`, `count`, `seconds`, `path`, `port` or `name`.
    pub kind: String,
    /// The default value as text.
    pub default: Option<String>,
    /// True when it may be given several times.
    pub repeatable: bool,
    /// The help text.
    pub help: String,
    /// Other names of the flag, without `--`.
    pub aliases: Vec<String>,
    /// True for a flag help leaves out (workers start each other with it).
    pub hidden: bool,
}

/// The flags every worker takes.
#[napi(js_name = "_workerFlags")]
pub fn worker_flags() -> Vec<WorkerFlagInfo> {
    WORKER_FLAGS.iter().map(flag_info).collect()
}

/// The flags of `colocated status` after its addresses.
#[napi(js_name = "_statusFlags")]
pub fn status_flags() -> Vec<WorkerFlagInfo> {
    core::worker::STATUS_FLAGS.iter().map(flag_info).collect()
}

/// The values of `colocated status`'s flags, as parsed.
#[napi(object)]
pub struct StatusValues {
    pub addresses: Vec<String>,
    pub token_file: Option<String>,
    pub tls_ca: Option<String>,
    pub tls_domain: Option<String>,
    pub timeout: f64,
    pub cluster: String,
    pub port: Option<String>,
}

/// `colocated status`: resolves with one line per worker and whether all
/// answered (asked on libuv's thread pool). Rejects with
/// `InvalidArgumentError` naming a bad flag, `NotFoundError` when no worker
/// is given or found.
#[napi(js_name = "_status", ts_return_type = "Promise<[string, boolean]>")]
pub fn status(values: StatusValues) -> AsyncTask<Status> {
    AsyncTask::new(Status(core::worker::StatusFlags {
        addresses: values.addresses,
        token_file: values.token_file.map(Into::into),
        tls_ca: values.tls_ca.map(Into::into),
        tls_domain: values.tls_domain,
        timeout: values.timeout,
        cluster: values.cluster,
        port: values.port,
    }))
}

/// `colocated status`, on libuv's thread pool.
pub struct Status(core::worker::StatusFlags);

impl Task for Status {
    type Output = core::Result<(String, bool)>;
    type JsValue = (String, bool);

    fn compute(&mut self) -> napi::Result<Self::Output> {
        Ok(self.0.run())
    }

    fn resolve(&mut self, env: Env, output: Self::Output) -> napi::Result<(String, bool)> {
        output.map_err(|e| crate::errors::to_js(&env, &e))
    }
}

fn flag_info(f: &core::worker::WorkerFlag) -> WorkerFlagInfo {
    WorkerFlagInfo {
        name: f.name.to_string(),
        kind: f.kind.name().to_string(),
        default: f.default.map(str::to_string),
        repeatable: f.repeatable,
        help: f.help.to_string(),
        aliases: f.aliases.iter().map(|a| a.to_string()).collect(),
        hidden: f.hidden,
    }
}

/// The values of the worker flags, as parsed (text already converted).
#[napi(object)]
pub struct WorkerValues {
    pub listen: String,
    pub port: Option<String>,
    pub cpu_devices: Option<u32>,
    /// `--pjrt-plugin`: a PJRT plugin library or name.
    pub pjrt_plugin: Option<String>,
    /// `--pjrt-option`, each (`KEY=VALUE`).
    pub pjrt_options: Vec<String>,
    pub token_file: Option<String>,
    pub insecure: bool,
    pub tls_cert: Option<String>,
    pub tls_key: Option<String>,
    pub heartbeat_interval: f64,
    pub session_timeout: f64,
    pub plugins: Vec<String>,
    pub exit_after_idle: Option<f64>,
    /// `--trace`: this worker's own trace file.
    pub trace: Option<String>,
    /// `--isolate-sessions` (this worker's default).
    pub isolate_sessions: bool,
    /// `--shared-sessions`.
    pub shared_sessions: bool,
    /// `--single-session` (a supervisor's session worker).
    pub single_session: bool,
}

/// A running worker.
#[napi]
pub struct WorkerHandle {
    worker: Mutex<Option<Worker>>,
    address: String,
}

#[napi]
impl WorkerHandle {
    /// `HOST:PORT` it listens on.
    #[napi(getter)]
    pub fn address(&self) -> String {
        self.address.clone()
    }

    /// True once it has had no session for `--exit-after-idle` seconds.
    #[napi(getter)]
    pub fn idle_expired(&self) -> bool {
        let worker = self.worker.lock().unwrap_or_else(|e| e.into_inner());
        worker.as_ref().is_some_and(Worker::idle_expired)
    }

    /// Stops serving: ends every session (their objects are freed). Waits
    /// off the event loop (programs in flight there may still finish).
    #[napi(ts_return_type = "Promise<void>")]
    pub fn shutdown(&self) -> AsyncTask<Shutdown> {
        let worker = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take();
        AsyncTask::new(Shutdown { worker })
    }
}

/// A worker's shutdown, on libuv's thread pool.
pub struct Shutdown {
    worker: Option<Worker>,
}

impl Task for Shutdown {
    type Output = core::Result<()>;
    type JsValue = ();

    fn compute(&mut self) -> napi::Result<Self::Output> {
        Ok(self.worker.take().map_or(Ok(()), Worker::shutdown))
    }

    fn resolve(&mut self, env: Env, output: Self::Output) -> napi::Result<()> {
        output.map_err(|e| crate::errors::to_js(&env, &e))
    }
}

/// What a Node worker logs when `COLOCATED_LOG` is unset: colocated's
/// warnings (refused requests, an insecure or exposed worker).
const WORKER_DEFAULT_LOG: &str = "colocated=warn";

/// Starts serving this process's devices with `values` (checked by core's
/// rules: `InvalidArgumentError` naming a bad flag). `command` (the program,
/// then the arguments before the flags: `[node, script, "worker"]`) starts
/// another Node worker: as the JavaScript that controllers send runs here,
/// each session runs in a worker process of its own, started with that
/// command, unless `--shared-sessions` is given. The worker's client
/// becomes the default one: the functions it runs place their outputs with
/// it. Sets up this process's logging and tracing as a worker's, unless
/// something set them up before (see `colocated_core::trace::init_worker`).
#[napi(js_name = "_startWorker")]
pub fn start_worker(
    env: Env,
    values: WorkerValues,
    command: Vec<String>,
) -> napi::Result<WorkerHandle> {
    let mut command = command.into_iter();
    let kind = WorkerKind {
        program: command
            .next()
            .ok_or_else(|| core::Error::invalid_argument("a worker's command needs a program"))
            .js(&env)?
            .into(),
        args: command.collect(),
        isolates_by_default: true,
    };
    let flags = WorkerFlags {
        listen: values.listen,
        port: values.port,
        cpu_devices: values.cpu_devices.map(|n| n as usize),
        pjrt_plugin: values.pjrt_plugin,
        pjrt_options: values.pjrt_options,
        token_file: values.token_file.map(Into::into),
        insecure: values.insecure,
        tls_cert: values.tls_cert.map(Into::into),
        tls_key: values.tls_key.map(Into::into),
        heartbeat_interval: values.heartbeat_interval,
        session_timeout: values.session_timeout,
        plugins: values.plugins.iter().map(Into::into).collect(),
        exit_after_idle: values.exit_after_idle,
        trace: values.trace.map(Into::into),
        isolate_sessions: values.isolate_sessions,
        shared_sessions: values.shared_sessions,
        single_session: values.single_session,
    };
    // Before the client exists (it would set up a controller's tracing):
    // warnings for the operator, COLOCATED_TRACE left to the controller.
    core::trace::init_worker(WORKER_DEFAULT_LOG, flags.trace_file().as_deref());
    let options = flags.options(&kind).js(&env)?;
    let client = core::Client::new_local(flags.client_options().js(&env)?).js(&env)?;
    let client = with_node(client);
    for path in &flags.plugins {
        colocated_plugin::load_plugin(&client, path).js(&env)?;
    }
    let worker = Worker::start(client.clone(), options).js(&env)?;
    core::set_default_client(Some(client));
    Ok(WorkerHandle {
        address: worker.local_addr().to_string(),
        worker: Mutex::new(Some(worker)),
    })
}
