//! `Client` and `Device`: the default client's topology, as Python objects.

use colocated_core as core;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::errors::py_err;
use crate::fork::ForkSafe;

/// A client: the in-process host with CPU devices, or (from `connect`) worker
/// hosts with, optionally, the in-process host. The package keeps one default
/// client and hands out its devices.
#[pyclass(module = "colocated", frozen, weakref)]
pub struct Client {
    pub(crate) inner: ForkSafe<core::Client>,
    devices: Vec<Py<Device>>,
}

#[pymethods]
impl Client {
    /// Creates a local client with `num_cpu_devices` CPU devices (default: the
    /// number of cores) and, with `pjrt_plugin` (a library path), the devices
    /// of that PJRT plugin made with `pjrt_options` (`(name, value)` pairs).
    /// Raises `InvalidArgumentError` for an impossible count or option, and
    /// the plugin's errors (`NotFoundError` for a missing library).
    #[new]
    #[pyo3(signature = (num_cpu_devices=None, executor_threads=None, pjrt_plugin=None, pjrt_options=None))]
    fn new(
        py: Python<'_>,
        num_cpu_devices: Option<usize>,
        executor_threads: Option<usize>,
        pjrt_plugin: Option<std::path::PathBuf>,
        pjrt_options: Option<Vec<(String, Bound<'_, PyAny>)>>,
    ) -> PyResult<Self> {
        let mut options = local_options(num_cpu_devices, executor_threads);
        options.pjrt = pjrt(pjrt_plugin, pjrt_options)?;
        let client = py
            .detach(|| core::Client::new_local(options))
            .map_err(py_err)?;
        Client::wrap(py, client)
    }

    /// Connects to the workers at `addresses` (`HOST:PORT` each), or, when
    /// none are given, to those found as `cluster` says (core's
    /// `find_workers`: `COLOCATED_WORKERS`, the Slurm job, Kubernetes); worker
    /// `i` becomes process `i + 1`, and the in-process host (process 0, with
    /// `num_cpu_devices` devices) is a host too when `include_local`. Waits
    /// (without the GIL) up to `timeout` seconds for each worker. The token
    /// is `token`, else the one in `token_file`, else `COLOCATED_TOKEN`'s. Raises
    /// `UnavailableError` for a worker that cannot be reached,
    /// `UnauthenticatedError` for a refused token, `InvalidArgumentError` for
    /// bad options.
    #[staticmethod]
    #[pyo3(signature = (addresses, *, token=None, token_file=None, tls_ca=None, tls_domain=None, include_local=false, timeout=10.0, num_cpu_devices=None, executor_threads=None, cluster=String::from("auto"), port=None, service=None, replicas=None, namespace=None))]
    #[allow(clippy::too_many_arguments)]
    fn connect(
        py: Python<'_>,
        addresses: Vec<String>,
        token: Option<String>,
        token_file: Option<std::path::PathBuf>,
        tls_ca: Option<Vec<u8>>,
        tls_domain: Option<String>,
        include_local: bool,
        timeout: f64,
        num_cpu_devices: Option<usize>,
        executor_threads: Option<usize>,
        cluster: String,
        port: Option<u16>,
        service: Option<String>,
        replicas: Option<usize>,
        namespace: Option<String>,
    ) -> PyResult<Self> {
        let token = crate::remote::token_from(token, token_file)?;
        let timeout = crate::remote::seconds("timeout", timeout)?;
        let mut connect = core::session::ConnectOptions::new("", token);
        connect.timeout = timeout;
        connect.tls_ca = tls_ca;
        connect.tls_domain = tls_domain;
        let local = local_options(num_cpu_devices, executor_threads);
        let discovery = core::cluster::Discovery {
            cluster,
            port,
            service,
            replicas,
            namespace,
            timeout,
        };
        let client = py
            .detach(|| {
                let options = core::ClusterOptions::find(
                    &addresses,
                    &discovery,
                    &connect,
                    include_local,
                    local,
                )?;
                core::Client::connect(&options)
            })
            .map_err(|e| crate::errors::to_py(py, &e))?;
        Client::wrap(py, client)
    }

    /// Ends the sessions with this client's workers now: they free what they
    /// hold for it, and work in flight there and later uses fail with
    /// `CancelledError` (the `"lost"` host event of each worker carries it).
    /// Closing twice does nothing.
    fn close(&self) -> PyResult<()> {
        self.inner.get().map_err(py_err)?.close();
        Ok(())
    }

    /// Calls `callback(event)` with a `HostEvent` for every event of this
    /// client's worker hosts from now on (a link broke, came back; a session
    /// lost for good, replaced by a new one), in order, on a thread of the
    /// client's own, holding the GIL for the call only; first with the loss
    /// of each host whose current session was lost before it came. An exception the
    /// callback raises goes to `sys.unraisablehook`, and the callback keeps
    /// listening. Returns the listener's id, for `remove_host_listener`. The
    /// client holds the callback until it is removed: a callback that refers
    /// to the client keeps it alive until then. Raises
    /// `InvalidArgumentError` when `callback` is not callable.
    fn on_host_event(&self, callback: &Bound<'_, PyAny>) -> PyResult<u64> {
        let client = self.inner.get().map_err(py_err)?;
        if !callback.is_callable() {
            return Err(py_err(core::Error::invalid_argument(format!(
                "on_host_event takes a callable, got {}",
                callback.get_type().name()?
            ))));
        }
        crate::host_events::listen(client, callback.clone().unbind()).map_err(py_err)
    }

    /// Stops calling listener `listener_id`; False if it was not listening.
    /// A call of it already under way finishes.
    fn remove_host_listener(&self, listener_id: u64) -> PyResult<bool> {
        let client = self.inner.get().map_err(py_err)?;
        Ok(client.remove_host_listener(listener_id))
    }

    /// How often each host event happened to host `host` (its index in
    /// `hosts()`) since the client started, as a `HostStats`: zeros for the
    /// in-process host. Raises `InvalidArgumentError` for an index out of
    /// range.
    fn host_stats(&self, host: i64) -> PyResult<crate::host_events::HostStats> {
        let client = self.inner.get().map_err(py_err)?;
        // Python's negative ints are no index either.
        let index = usize::try_from(host).map_err(|_| {
            py_err(core::Error::invalid_argument(format!(
                "host {host} is out of range ({} hosts)",
                client.hosts().len()
            )))
        })?;
        let stats = client.host_stats(index).map_err(py_err)?;
        Ok(crate::host_events::HostStats::wrap(stats))
    }

    /// The hosts, in index order: the in-process host first when it is one.
    fn hosts(&self) -> PyResult<Vec<Host>> {
        let client = self.inner.get().map_err(py_err)?;
        Ok(client
            .hosts()
            .iter()
            .map(|h| Host {
                index: h.index(),
                process_index: h.process_index(),
                name: h.name().to_string(),
                device_ids: h.device_ids().to_vec(),
                is_remote: h.is_remote(),
            })
            .collect())
    }

    /// An id of the client, unique in this process (not across processes).
    #[getter]
    fn id(&self) -> u64 {
        self.inner.metadata().id()
    }

    /// Platform name of the runtime (`"colocated"`).
    #[getter]
    fn platform_name(&self) -> &'static str {
        self.inner.metadata().platform_name()
    }

    /// Version of the runtime.
    #[getter]
    fn platform_version(&self) -> &'static str {
        self.inner.metadata().platform_version()
    }

    /// Index of this (controller) process.
    #[getter]
    fn process_index(&self) -> u32 {
        self.inner.metadata().process_index()
    }

    /// The devices of `backend` (default: the default backend's), in id
    /// order; `"cpu"` gives the CPU devices colocated Python runs on.
    /// `NotFoundError` for a backend the client lacks.
    #[pyo3(signature = (backend=None))]
    fn devices(&self, py: Python<'_>, backend: Option<&str>) -> PyResult<Vec<Py<Device>>> {
        let client = self.inner.get().map_err(py_err)?;
        let chosen = client.backend_devices(backend).map_err(py_err)?;
        Ok(chosen.iter().map(|d| self.device_object(py, d)).collect())
    }

    /// The default backend: a PJRT plugin's (`"cuda"`, `"pjrt_cpu"` for XLA's
    /// CPU plugin, ...) when the client has one, else `"cpu"`.
    fn default_backend(&self) -> PyResult<String> {
        let client = self.inner.get().map_err(py_err)?;
        Ok(client.default_backend().to_string())
    }

    /// The devices this process can address, in id order.
    fn local_devices(&self, py: Python<'_>) -> Vec<Py<Device>> {
        let local = self.inner.metadata().addressable_devices();
        self.devices
            .iter()
            .filter(|d| local.contains(d.get().inner.metadata()))
            .map(|d| d.clone_ref(py))
            .collect()
    }

    /// The device with global id `id`; `NotFoundError` if there is none.
    fn device(&self, py: Python<'_>, id: u32) -> PyResult<Py<Device>> {
        let client = self.inner.get().map_err(py_err)?;
        let device = client.lookup_device(id).map_err(py_err)?;
        Ok(self.device_object(py, &device))
    }

    /// Maps each device to the CPU device of the same host, in order.
    fn colocated_cpu_devices(
        &self,
        py: Python<'_>,
        devices: Vec<PyRef<'_, Device>>,
    ) -> PyResult<Vec<Py<Device>>> {
        let client = self.inner.get().map_err(py_err)?;
        let devices: Vec<core::Device> = devices
            .iter()
            .map(|d| d.inner.get().cloned())
            .collect::<Result<_, _>>()
            .map_err(py_err)?;
        let cpus = client.colocated_cpu_devices(&devices).map_err(py_err)?;
        Ok(cpus.iter().map(|d| self.device_object(py, d)).collect())
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner.metadata())
    }
}

/// Local host options of the SDK's clients.
fn local_options(
    num_cpu_devices: Option<usize>,
    executor_threads: Option<usize>,
) -> core::ClientOptions {
    // Colocated Python functions often block (I/O, barriers): the runtime
    // starts more executor threads while every one is busy, so calls from
    // different threads run concurrently whatever the number of cores.
    core::ClientOptions {
        num_cpu_devices,
        executor_threads,
        ..Default::default()
    }
}

impl Client {
    /// Wraps `client`, whose local host runs Python programs from now on.
    fn wrap(py: Python<'_>, client: core::Client) -> PyResult<Self> {
        client
            .register_executor(crate::executor::LANGUAGE, crate::executor::PythonExecutor)
            .map_err(py_err)?;
        let devices = client
            .devices()
            .iter()
            .map(|d| Py::new(py, Device::new(client.clone(), d.clone())))
            .collect::<PyResult<_>>()?;
        Ok(Client {
            inner: ForkSafe::new(client),
            devices,
        })
    }

    fn device_object(&self, py: Python<'_>, device: &core::Device) -> Py<Device> {
        self.devices
            .iter()
            .find(|d| d.get().inner.metadata() == device)
            .map(|d| d.clone_ref(py))
            .expect("a client's devices are all in its table")
    }
}

/// A host of a client: the in-process host or a worker.
#[pyclass(module = "colocated", frozen, get_all)]
pub struct Host {
    /// Index in `Client.hosts()`.
    index: usize,
    /// The process index its devices report.
    process_index: u32,
    /// `"local"`, or the worker's `HOST:PORT`.
    name: String,
    /// Global ids of its devices.
    device_ids: Vec<u32>,
    /// True for a worker (reached over the network).
    is_remote: bool,
}

#[pymethods]
impl Host {
    fn __repr__(&self) -> String {
        format!(
            "Host(index={}, process_index={}, name={:?}, devices={:?})",
            self.index, self.process_index, self.name, self.device_ids
        )
    }
}

/// One device, as JAX shows it (`CpuDevice(id=0)`). Equal and hashed by id.
#[pyclass(module = "colocated", frozen)]
pub struct Device {
    pub(crate) client: ForkSafe<core::Client>,
    pub(crate) inner: ForkSafe<core::Device>,
}

impl Device {
    /// A Python object for `device` of `client` (equal to every other object of
    /// the same device).
    pub(crate) fn new(client: core::Client, device: core::Device) -> Self {
        Device {
            client: ForkSafe::new(client),
            inner: ForkSafe::new(device),
        }
    }
}

#[pymethods]
impl Device {
    /// Global device id.
    #[getter]
    fn id(&self) -> u32 {
        self.inner.metadata().id()
    }

    /// Platform of the device (`"cpu"`; a PJRT plugin's, such as `"cuda"`).
    #[getter]
    fn platform(&self) -> String {
        self.inner.metadata().platform().to_string()
    }

    /// The backend the device belongs to (`"cpu"` for the CPU devices
    /// colocated Python runs on; a PJRT plugin's backend name).
    #[getter]
    fn backend(&self) -> String {
        self.inner.metadata().backend().to_string()
    }

    /// Kind of the device (`"cpu"`; a plugin's, such as `"NVIDIA H100 80GB HBM3"`).
    #[getter]
    fn device_kind(&self) -> String {
        self.inner.metadata().kind().to_string()
    }

    /// Index of the process (host) that owns the device.
    #[getter]
    fn process_index(&self) -> u32 {
        self.inner.metadata().process_index()
    }

    /// Index of the device among its host's devices of the same kind.
    #[getter]
    fn local_hardware_id(&self) -> u32 {
        self.inner.metadata().local_hardware_id()
    }

    /// Index of the owning host in the client's host list.
    #[getter]
    fn host_index(&self) -> usize {
        self.inner.metadata().host_index()
    }

    /// Backend-defined attributes (str -> int | str | bool).
    #[getter]
    fn attributes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for (key, value) in self.inner.metadata().attributes() {
            match value {
                core::AttributeValue::Int(v) => out.set_item(key, v)?,
                core::AttributeValue::String(v) => out.set_item(key, v)?,
                core::AttributeValue::Bool(v) => out.set_item(key, v)?,
            }
        }
        Ok(out)
    }

    /// The kind of the memory space buffers go to unless told otherwise
    /// (`"device"`).
    #[getter]
    fn default_memory_kind(&self) -> &'static str {
        self.inner.metadata().default_memory_space().kind().name()
    }

    /// The kinds of the memory spaces the device can address, default first.
    #[getter]
    fn memory_kinds(&self) -> Vec<&'static str> {
        self.inner
            .metadata()
            .memory_kinds()
            .into_iter()
            .map(core::MemoryKind::name)
            .collect()
    }

    /// Raises `InvalidArgumentError`, naming the kinds the device has, unless
    /// it addresses memory of kind `kind`.
    fn check_memory_kind(&self, kind: &str) -> PyResult<()> {
        self.inner
            .metadata()
            .memory_space_by_kind(kind)
            .map(|_| ())
            .map_err(py_err)
    }

    /// Placement in words: `cpu:3 (process 0, host 0, local 3)`.
    fn debug_string(&self) -> String {
        self.inner.metadata().debug_string()
    }

    fn __repr__(&self) -> String {
        self.inner.metadata().to_string_short()
    }

    fn __hash__(&self) -> u64 {
        u64::from(self.inner.metadata().id())
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Device>()
            .is_ok_and(|o| o.get().inner.metadata() == self.inner.metadata())
    }

    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        // Pickled devices are stable global ids, resolved in the same client
        // when unpickled in this process, else in the default client (the
        // package's `reduce_device` hook says how).
        crate::hooks::hooks(py)?
            .reduce_device
            .bind(py)
            .call1((self.id(), self.client.metadata().id()))?
            .cast_into::<PyTuple>()
            .map_err(Into::into)
    }
}

/// Maps each device to the CPU device of the same host, in order, in the
/// devices' own client (`InvalidArgumentError` for devices of several clients).
#[pyfunction]
pub fn colocated_cpu_devices(devices: Vec<PyRef<'_, Device>>) -> PyResult<Vec<Device>> {
    let Some(first) = devices.first() else {
        return Ok(Vec::new());
    };
    let client = first.client.get().map_err(py_err)?.clone();
    let devices: Vec<core::Device> = devices
        .iter()
        .map(|d| d.inner.get().cloned())
        .collect::<Result<_, _>>()
        .map_err(py_err)?;
    let cpus = client.colocated_cpu_devices(&devices).map_err(py_err)?;
    Ok(cpus
        .into_iter()
        .map(|d| Device::new(client.clone(), d))
        .collect())
}

/// Sets the options of the process's default client (core's rule: before its
/// first use, else `FailedPreconditionError`; counts of at least 1).
#[pyfunction]
#[pyo3(signature = (num_cpu_devices=None, pjrt_plugin=None, pjrt_options=None))]
pub fn configure_default(
    num_cpu_devices: Option<usize>,
    pjrt_plugin: Option<std::path::PathBuf>,
    pjrt_options: Option<Vec<(String, Bound<'_, PyAny>)>>,
) -> PyResult<()> {
    let mut options = local_options(num_cpu_devices, None);
    options.pjrt = pjrt(pjrt_plugin, pjrt_options)?;
    core::configure(options).map_err(py_err)
}

/// Sets the default client's options from a worker's flags (core's
/// `WorkerFlags::client_options`: `--cpu-devices`, `--pjrt-plugin`, each
/// `--pjrt-option` as `KEY=VALUE`, else `COLOCATED_PJRT_PLUGIN`).
#[pyfunction]
#[pyo3(signature = (cpu_devices, pjrt_plugin, pjrt_options))]
pub fn configure_worker_client(
    cpu_devices: Option<usize>,
    pjrt_plugin: Option<String>,
    pjrt_options: Vec<String>,
) -> PyResult<()> {
    let flags = core::worker::WorkerFlags {
        cpu_devices,
        pjrt_plugin,
        pjrt_options,
        ..Default::default()
    };
    core::configure(flags.client_options().map_err(py_err)?).map_err(py_err)
}

/// The PJRT options of `plugin` and its create `options`.
fn pjrt(
    plugin: Option<std::path::PathBuf>,
    options: Option<Vec<(String, Bound<'_, PyAny>)>>,
) -> PyResult<Option<core::PjrtOptions>> {
    let plugin = plugin
        .map(|p| {
            p.into_os_string().into_string().map_err(|_| {
                py_err(core::Error::invalid_argument(
                    "pjrt_plugin is not valid UTF-8",
                ))
            })
        })
        .transpose()?;
    let options = options
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| pjrt_value(&k, &v).map(|v| (k, v)))
        .collect::<PyResult<_>>()?;
    core::PjrtOptions::of(plugin.as_deref(), options).map_err(py_err)
}

/// A plugin create option's value: a bool, an int, a float, a str or a list
/// of ints.
fn pjrt_value(name: &str, v: &Bound<'_, PyAny>) -> PyResult<core::PjrtValue> {
    use pyo3::types::{PyBool, PyFloat, PyInt, PyString};
    if v.is_instance_of::<PyBool>() {
        return Ok(core::PjrtValue::Bool(v.extract()?));
    }
    if v.is_instance_of::<PyInt>() {
        return Ok(core::PjrtValue::Int64(v.extract()?));
    }
    if v.is_instance_of::<PyFloat>() {
        return Ok(core::PjrtValue::Float(v.extract::<f64>()? as f32));
    }
    if v.is_instance_of::<PyString>() {
        return Ok(core::PjrtValue::String(v.extract()?));
    }
    if let Ok(list) = v.extract::<Vec<i64>>() {
        return Ok(core::PjrtValue::Int64List(list));
    }
    Err(py_err(core::Error::invalid_argument(format!(
        "PJRT option {name}: a bool, int, float, str or list of ints was expected, got {}",
        v.get_type().name()?
    ))))
}

/// The wrapper of core's default client last handed out, by that client's
/// id: core decides which client is the default (after a connect, a reset, a
/// fork), this only keeps one wrapper per client. Taken only under the GIL.
static DEFAULT_WRAPPER: std::sync::Mutex<Option<(u64, Py<Client>)>> = std::sync::Mutex::new(None);

/// The wrapper of `client`, core's default: the one handed out before when
/// it is the same client, else a new one.
fn default_wrapper(py: Python<'_>, client: core::Client) -> PyResult<Py<Client>> {
    let id = client.id();
    let cached = |py| {
        let wrapper = DEFAULT_WRAPPER.lock().unwrap_or_else(|e| e.into_inner());
        wrapper
            .as_ref()
            .filter(|(cached, _)| *cached == id)
            .map(|(_, w): &(u64, Py<Client>)| w.clone_ref(py))
    };
    if let Some(wrapper) = cached(py) {
        return Ok(wrapper);
    }
    let wrapper = Py::new(py, Client::wrap(py, client)?)?;
    crate::hooks::hooks(py)?
        .register_client
        .call1(py, (wrapper.clone_ref(py),))?;
    let replaced = DEFAULT_WRAPPER
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .replace((id, wrapper.clone_ref(py)));
    drop(replaced);
    Ok(wrapper)
}

/// The process's default client (core's, asked each time), created on first
/// use from the configured options (else `COLOCATED_NUM_CPU_DEVICES`);
/// with `create=False`, None when there is none yet.
#[pyfunction]
#[pyo3(signature = (create=true))]
pub fn default_client(py: Python<'_>, create: bool) -> PyResult<Option<Py<Client>>> {
    // Creating it may take a while, and another thread may be creating it
    // (core's lock is held meanwhile): both without the GIL.
    let client = match (py.detach(core::current_default_client), create) {
        (Some(client), _) => client,
        (None, true) => py.detach(core::default_client).map_err(py_err)?,
        (None, false) => return Ok(None),
    };
    default_wrapper(py, client).map(Some)
}

/// Makes `client` the process's default client (`None`: lets it go).
#[pyfunction]
pub fn set_default_client(client: Option<Py<Client>>) -> PyResult<()> {
    let Some(wrapper) = client else {
        core::set_default_client(None);
        return Ok(());
    };
    let inner = wrapper.get().inner.get().cloned().map_err(py_err)?;
    let id = inner.id();
    core::set_default_client(Some(inner));
    // Its wrapper is the one handed out as the default from now on.
    let replaced = DEFAULT_WRAPPER
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .replace((id, wrapper));
    drop(replaced);
    Ok(())
}
