//! Clients, hosts and devices; the default client (core's), and connecting
//! to workers.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use colocated_core as core;
use napi::bindgen_prelude::{AsyncTask, ClassInstance, Either, Either4, Function, Unknown};
use napi::{Env, Task};
use napi_derive::napi;

use crate::errors::{invalid, to_js, OrThrow};
use crate::host_events::{Heard, HostListener, HostStats};

/// A device: where a buffer lives and a program runs.
#[napi]
#[derive(Clone)]
pub struct Device {
    pub(crate) client: core::Client,
    pub(crate) inner: core::Device,
}

#[napi]
impl Device {
    /// Global id, unique in its client.
    #[napi(getter)]
    pub fn id(&self) -> u32 {
        self.inner.id()
    }

    /// Kind of device (`"cpu"`; a PJRT plugin's, such as `"NVIDIA H100 80GB HBM3"`).
    #[napi(getter)]
    pub fn kind(&self) -> String {
        self.inner.kind().to_string()
    }

    /// Platform (`"cpu"`; a PJRT plugin's, such as `"cuda"`).
    #[napi(getter)]
    pub fn platform(&self) -> String {
        self.inner.platform().to_string()
    }

    /// Backend: `"cpu"` for the CPU devices where colocated functions run; a
    /// PJRT plugin's backend name (`"cuda"`, `"pjrt_cpu"`) for its devices.
    #[napi(getter)]
    pub fn backend(&self) -> String {
        self.inner.backend().to_string()
    }

    /// The process (host) that owns it: 0 for the controller when it is a
    /// host, worker `i` is process `i + 1`.
    #[napi(getter)]
    pub fn process_index(&self) -> u32 {
        self.inner.process_index()
    }

    /// The memory kinds it can address (`"device"`, …).
    #[napi(getter)]
    pub fn memory_kinds(&self) -> Vec<String> {
        let kinds = self.inner.memory_kinds();
        kinds.iter().map(|k| k.name().to_string()).collect()
    }

    /// `CpuDevice(id=0)`.
    #[napi(js_name = "toString")]
    pub fn to_js_string(&self) -> String {
        self.inner.to_string()
    }
}

impl Device {
    pub(crate) fn of(client: &core::Client, inner: &core::Device) -> Device {
        Device {
            client: client.clone(),
            inner: inner.clone(),
        }
    }
}

/// An ordered queue of work of one client (see `Client.createStream`).
#[napi]
pub struct Stream {
    pub(crate) inner: core::Stream,
}

#[napi]
impl Stream {
    /// Its id, unique in this process.
    #[napi(getter)]
    pub fn id(&self) -> i64 {
        self.inner.id() as i64
    }
}

/// Runs `f` with `stream` (if any) as the calling thread's stream.
pub(crate) fn on_stream<R>(stream: Option<&Stream>, f: impl FnOnce() -> R) -> R {
    match stream {
        Some(s) => core::with_stream(&s.inner, f),
        None => f(),
    }
}

/// A host of a client: the controller's process or a worker.
#[napi(object)]
pub struct Host {
    /// Index among the client's hosts.
    pub index: u32,
    /// Process index its devices report.
    pub process_index: u32,
    /// `"local"` or the worker's address.
    pub name: String,
    /// Ids of its devices.
    pub device_ids: Vec<u32>,
    /// True for a worker (reached over the network).
    pub is_remote: bool,
}

/// A client: hosts with devices, on which arrays live and programs run.
#[napi]
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: core::Client,
    /// The listener of host events of this `Client` object (`index.js`
    /// emits them), once one listens: removed from core when the client
    /// closes or this object is collected.
    host_listener: Arc<Mutex<Option<HostListener>>>,
}

impl Client {
    /// The `Client` object of `inner`.
    pub(crate) fn of(inner: core::Client) -> Client {
        Client {
            inner,
            host_listener: Arc::default(),
        }
    }

    /// This object's host listener, locked.
    fn listener(&self) -> MutexGuard<'_, Option<HostListener>> {
        self.host_listener.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[napi]
impl Client {
    /// The devices of `backend` (default: the default backend's: a PJRT
    /// plugin's when the client has one, else every device), in id order;
    /// `'cpu'` gives the CPU devices colocated functions run on. Throws
    /// `NotFoundError` for a backend the client lacks.
    #[napi]
    pub fn devices(&self, env: Env, backend: Option<String>) -> napi::Result<Vec<Device>> {
        let devices = self.inner.backend_devices(backend.as_deref()).js(&env)?;
        Ok(devices.iter().map(|d| Device::of(&self.inner, d)).collect())
    }

    /// The default backend: a PJRT plugin's (`'cuda'`, `'pjrt_cpu'` for
    /// XLA's CPU plugin) when the client has one, else `'cpu'`.
    #[napi]
    pub fn default_backend(&self) -> String {
        self.inner.default_backend().to_string()
    }

    /// The devices this process can address: every device, workers' too
    /// (as in the Python SDK: the controller addresses its workers' devices).
    #[napi]
    pub fn local_devices(&self) -> Vec<Device> {
        let devices = self.inner.addressable_devices();
        devices.iter().map(|d| Device::of(&self.inner, d)).collect()
    }

    /// The hosts, in index order (this process first when it is one).
    #[napi]
    pub fn hosts(&self) -> Vec<Host> {
        self.inner
            .hosts()
            .iter()
            .map(|h| Host {
                index: h.index() as u32,
                process_index: h.process_index(),
                name: h.name().to_string(),
                device_ids: h.device_ids().to_vec(),
                is_remote: h.is_remote(),
            })
            .collect()
    }

    /// An id of the client, unique in this process.
    #[napi(getter)]
    pub fn id(&self) -> i64 {
        self.inner.id() as i64
    }

    /// Ends the client's sessions with its workers now (the workers free
    /// what they hold for it); work there fails with `CancelledError`, and
    /// `hostLost` tells each host whose session it ended. The local host
    /// stays usable.
    #[napi]
    pub fn close(&self) {
        let listener = self.listener().take();
        match listener {
            Some(listener) => listener.close(&self.inner),
            None => self.inner.close(),
        }
    }

    /// Calls `tell({host, kind, error})` on the event loop with each host
    /// event from now on (`kind`: `'disconnected'`, `'reconnected'`,
    /// `'lost'` or `'reopened'`; `error`, a `ColocatedError`, for the first
    /// and the third), and at once with the loss of each host lost already.
    /// It replaces the function given before, keeps nothing alive, and is
    /// let go when the client closes or is collected. (`client.on('hostLost',
    /// …)` and the other host events are built on it.)
    #[napi(
        js_name = "_listenHosts",
        ts_args_type = "tell: (event: { host: number, kind: 'disconnected' | 'reconnected' | 'lost' | 'reopened', error?: Error }) => void"
    )]
    pub fn listen_hosts(
        &self,
        env: Env,
        tell: Function<Heard, Unknown<'static>>,
    ) -> napi::Result<()> {
        let listener = HostListener::new(&self.inner, tell).js(&env)?;
        let replaced = self.listener().replace(listener);
        // Out of the lock: this removes the one before from core.
        drop(replaced);
        Ok(())
    }

    /// How often each host event happened to host `index` since the client
    /// started: `{disconnects, reconnects, sessionsLost, sessionsReopened}`
    /// (zeros for the local host). Throws `InvalidArgumentError` for an
    /// index that is not one of a host.
    #[napi]
    pub fn host_stats(&self, env: Env, index: f64) -> napi::Result<HostStats> {
        if !(index >= 0.0 && index.fract() == 0.0 && index <= u32::MAX as f64) {
            return Err(to_js(
                &env,
                &invalid(format!(
                    "hostStats: index must be a host's index, not {index}"
                )),
            ));
        }
        Ok(self.inner.host_stats(index as usize).js(&env)?.into())
    }

    /// A new stream of this client: work queued on it runs in its order,
    /// concurrently with other streams' (`stream.run(fn)` makes it the
    /// stream of the calls `fn` makes, across its awaits).
    #[napi]
    pub fn create_stream(&self) -> Stream {
        Stream {
            inner: self.inner.create_stream(),
        }
    }

    /// Loads a plugin library into this process's host: its native functions
    /// become programs of language `'native'` here. Returns their names.
    /// Throws `InvalidArgumentError` for a library that is not a plugin.
    #[napi]
    pub fn load_plugin(&self, env: Env, path: String) -> napi::Result<Vec<String>> {
        colocated_plugin::load_plugin(&self.inner, std::path::Path::new(&path)).js(&env)
    }
}

/// Makes `client` run `node` programs in this process (once per client).
pub(crate) fn with_node(client: core::Client) -> core::Client {
    if let Err(e) = client.register_executor(crate::program::LANGUAGE, crate::program::NodeExecutor)
    {
        // Registered already (another wrapper of the same client did it).
        debug_assert_eq!(e.code(), core::ErrorCode::AlreadyExists, "{e}");
    }
    client
}

/// The default client, running `node` programs.
pub(crate) fn default_client() -> core::Result<core::Client> {
    core::default_client().map(with_node)
}

/// Options of the default client (see `configure`).
#[napi(object)]
pub struct ConfigureOptions {
    /// CPU devices of this process (default: `COLOCATED_NUM_CPU_DEVICES`,
    /// else the number of cores).
    pub num_cpu_devices: Option<f64>,
    /// Executor threads of this process (default: the number of cores).
    pub executor_threads: Option<f64>,
    /// A PJRT plugin whose devices join the CPU devices as the default
    /// backend: its library's path, or a name in
    /// `PJRT_NAMES_AND_LIBRARY_PATHS` (default: `COLOCATED_PJRT_PLUGIN`).
    pub pjrt_plugin: Option<String>,
    /// The plugin client's create options (`{cpu_device_count: 4}`): numbers,
    /// booleans, strings or arrays of integers.
    #[napi(ts_type = "Record<string, number | boolean | string | number[]>")]
    pub pjrt_options: Option<std::collections::HashMap<String, PjrtOptionValue>>,
}

/// Sets the options of the default client; call it before the first use.
/// Throws `FailedPreconditionError` once the default client exists.
#[napi]
pub fn configure(env: Env, options: ConfigureOptions) -> napi::Result<()> {
    let count = |name, v: Option<f64>| v.map(|v| crate::convert::count(name, v, 4096)).transpose();
    let pjrt = pjrt_options(&env, options.pjrt_plugin, options.pjrt_options)?;
    core::configure(core::ClientOptions {
        num_cpu_devices: count("numCpuDevices", options.num_cpu_devices).js(&env)?,
        executor_threads: count("executorThreads", options.executor_threads).js(&env)?,
        max_executor_threads: None,
        pjrt,
    })
    .js(&env)
}

/// A PJRT create option's value.
pub type PjrtOptionValue = Either4<f64, bool, String, Vec<f64>>;

/// The PJRT options of `plugin` (a path or a name, core's rule) and its
/// create `options`.
fn pjrt_options(
    env: &Env,
    plugin: Option<String>,
    options: Option<std::collections::HashMap<String, PjrtOptionValue>>,
) -> napi::Result<Option<core::PjrtOptions>> {
    let mut values = Vec::new();
    for (key, value) in options.unwrap_or_default() {
        let value = match value {
            Either4::A(n) if n.fract() == 0.0 && n.abs() < 9.0e15 => {
                core::PjrtValue::Int64(n as i64)
            }
            Either4::A(n) => core::PjrtValue::Float(n as f32),
            Either4::B(b) => core::PjrtValue::Bool(b),
            Either4::C(s) => core::PjrtValue::String(s),
            Either4::D(list) => {
                if list.iter().any(|n| n.fract() != 0.0) {
                    return Err(to_js(
                        env,
                        &core::Error::invalid_argument(format!(
                            "pjrtOptions.{key} must hold integers"
                        )),
                    ));
                }
                core::PjrtValue::Int64List(list.into_iter().map(|n| n as i64).collect())
            }
        };
        values.push((key, value));
    }
    // One order whatever the object's.
    values.sort_by(|a, b| a.0.cmp(&b.0));
    core::PjrtOptions::of(plugin.as_deref(), values).js(env)
}

/// The default client: this process with CPU devices, unless `connect` made
/// another one the default. Created on first use.
#[napi]
pub fn client(env: Env) -> napi::Result<Client> {
    let inner = default_client().js(&env)?;
    Ok(Client::of(inner))
}

/// The devices of `backend` of the default client (default: the default
/// backend's), in id order (`jax.devices()`).
#[napi]
pub fn devices(env: Env, backend: Option<String>) -> napi::Result<Vec<Device>> {
    client(env)?.devices(env, backend)
}

/// The default client's default backend (`jax.default_backend()`).
#[napi]
pub fn default_backend(env: Env) -> napi::Result<String> {
    Ok(client(env)?.default_backend())
}

/// The default client's addressable devices (`jax.local_devices()`).
#[napi]
pub fn local_devices(env: Env) -> napi::Result<Vec<Device>> {
    Ok(client(env)?.local_devices())
}

/// The CPU devices of the same hosts as `devices`, in order.
#[napi]
pub fn colocated_cpu_devices(
    env: Env,
    devices: Vec<ClassInstance<Device>>,
) -> napi::Result<Vec<Device>> {
    let Some(first) = devices.first() else {
        return Ok(Vec::new());
    };
    let client = first.client.clone();
    let inner: Vec<core::Device> = devices.iter().map(|d| d.inner.clone()).collect();
    let cpus = client.colocated_cpu_devices(&inner).js(&env)?;
    Ok(cpus.iter().map(|d| Device::of(&client, d)).collect())
}

/// Does nothing: the baseline of a call across the napi boundary, for the
/// benchmarks.
#[napi(js_name = "_noop")]
pub fn noop() {}

/// Options of `connect`.
#[napi(object)]
pub struct ConnectOptions {
    /// The workers' token (else `tokenFile`, else `COLOCATED_TOKEN`; none
    /// connects only to an `--insecure` worker).
    pub token: Option<String>,
    /// A file holding the token.
    pub token_file: Option<String>,
    /// PEM of the CA that signed the workers' certificates (its path, or its
    /// bytes): the connections use TLS.
    pub tls_ca: Option<Either<String, napi::bindgen_prelude::Buffer>>,
    /// The name the workers' certificates must carry (default: each
    /// address's host).
    pub tls_domain: Option<String>,
    /// Makes this process a host too (process 0).
    pub include_local: Option<bool>,
    /// Milliseconds to connect to each worker (default 10000).
    pub timeout: Option<f64>,
    /// Makes the new client the default one (default true).
    pub default: Option<bool>,
    /// CPU devices of this process, with `includeLocal`.
    pub num_cpu_devices: Option<f64>,
    /// Without addresses, where to find the workers: `'auto'` (the default:
    /// `COLOCATED_WORKERS`, then the Slurm job, then Kubernetes), `'env'`,
    /// `'slurm'` or `'kubernetes'`.
    pub cluster: Option<String>,
    /// Without addresses, the workers' port (default: the Slurm job's,
    /// `61440 + SLURM_JOB_ID % 4096`; 61440 in Kubernetes).
    pub port: Option<u32>,
    /// Kubernetes: the workers' headless Service (else
    /// `COLOCATED_KUBERNETES_SERVICE`).
    pub service: Option<String>,
    /// Kubernetes: how many workers its StatefulSet runs (else
    /// `COLOCATED_KUBERNETES_REPLICAS`).
    pub replicas: Option<u32>,
    /// Kubernetes: their namespace (default: this pod's, else `default`).
    pub namespace: Option<String>,
}

/// Finding and connecting to workers, on libuv's thread pool.
pub struct Connect {
    options: core::Result<Found>,
    make_default: bool,
}

/// What `connect` looks for: the addresses given, else where to find them,
/// and how to reach them.
pub struct Found {
    addresses: Vec<String>,
    discovery: core::cluster::Discovery,
    connect: core::session::ConnectOptions,
    include_local: bool,
    local: core::ClientOptions,
}

impl Task for Connect {
    type Output = core::Result<core::Client>;
    type JsValue = Client;

    fn compute(&mut self) -> napi::Result<Self::Output> {
        let options = std::mem::replace(
            &mut self.options,
            Err(core::Error::internal("connect ran twice")),
        );
        Ok(options.and_then(|o| {
            let options = core::ClusterOptions::find(
                &o.addresses,
                &o.discovery,
                &o.connect,
                o.include_local,
                o.local,
            )?;
            core::Client::connect(&options)
        }))
    }

    fn resolve(&mut self, env: Env, output: Self::Output) -> napi::Result<Client> {
        let inner = with_node(output.map_err(|e| to_js(&env, &e))?);
        if self.make_default {
            core::set_default_client(Some(inner.clone()));
        }
        Ok(Client::of(inner))
    }
}

/// Connects to worker hosts (`"HOST:PORT"` each; worker `i` is process
/// `i + 1`; none: those `options.cluster` finds) and resolves with a client
/// of them, waiting up to `timeout` for workers that are still starting.
/// Rejects with `UnavailableError` for workers that cannot be reached (each
/// named), `UnauthenticatedError` for a refused token, `NotFoundError` when
/// no worker is given or found (saying where it looked),
/// `InvalidArgumentError` for bad options.
#[napi(ts_return_type = "Promise<Client>")]
pub fn connect(
    addresses: Option<Either<String, Vec<String>>>,
    options: Option<ConnectOptions>,
) -> AsyncTask<Connect> {
    let options = options.unwrap_or(ConnectOptions {
        token: None,
        token_file: None,
        tls_ca: None,
        tls_domain: None,
        include_local: None,
        timeout: None,
        default: None,
        num_cpu_devices: None,
        cluster: None,
        port: None,
        service: None,
        replicas: None,
        namespace: None,
    });
    let make_default = options.default.unwrap_or(true);
    AsyncTask::new(Connect {
        options: cluster_options(addresses, options),
        make_default,
    })
}

fn cluster_options(
    addresses: Option<Either<String, Vec<String>>>,
    options: ConnectOptions,
) -> core::Result<Found> {
    let addresses = match addresses {
        None => Vec::new(),
        Some(Either::A(one)) => vec![one],
        Some(Either::B(many)) => many,
    };
    let token = core::transport::Token::resolve(
        options.token.as_deref(),
        options.token_file.as_deref().map(std::path::Path::new),
    )?;
    let timeout = match options.timeout {
        None => Duration::from_secs(10),
        Some(ms) => core::worker::seconds("timeout", ms / 1000.0)?,
    };
    let tls_ca = match options.tls_ca {
        None => None,
        Some(Either::A(path)) => Some(std::fs::read(&path).map_err(|e| {
            core::Error::invalid_argument(format!("cannot read tlsCa {path}: {e}"))
        })?),
        Some(Either::B(bytes)) => Some(bytes.to_vec()),
    };
    let mut connect = core::session::ConnectOptions::new("", token);
    connect.timeout = timeout;
    connect.tls_ca = tls_ca;
    connect.tls_domain = options.tls_domain;
    let local = core::ClientOptions {
        num_cpu_devices: options
            .num_cpu_devices
            .map(|n| crate::convert::count("numCpuDevices", n, 4096))
            .transpose()?,
        ..Default::default()
    };
    let port = options
        .port
        .map(|p| {
            u16::try_from(p)
                .map_err(|_| core::Error::invalid_argument(format!("port {p} is not a port")))
        })
        .transpose()?;
    let discovery = core::cluster::Discovery {
        cluster: options.cluster.unwrap_or_default(),
        port,
        service: options.service,
        replicas: options.replicas.map(|n| n as usize),
        namespace: options.namespace,
        timeout,
    };
    Ok(Found {
        addresses,
        discovery,
        connect,
        include_local: options.include_local.unwrap_or(false),
        local,
    })
}
