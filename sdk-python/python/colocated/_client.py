"""The default client: created lazily on first use, configured before that.
Which client is the default is core's to say (asked at each use), so that
this package and core never disagree.

After ``os.fork()`` the child gets a fresh default client on first use; objects
of the parent's runtime raise ``FailedPreconditionError`` there.
"""

from __future__ import annotations

import os
import secrets
import weakref

from . import _colocated
from ._errors import InvalidArgumentError, NotFoundError

#: Tags what this process pickles: a device unpickled in the same process goes
#: back to its own client, one unpickled elsewhere to that process's default.
_PROCESS_NONCE = secrets.randbits(63)
#: The live clients this package made, by ``Client.id``.
_CLIENTS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _register(c: _colocated.Client) -> _colocated.Client:
    _CLIENTS[c.id] = c
    return c


def configure(
    *,
    num_cpu_devices: int | None = None,
    pjrt_plugin: str | os.PathLike | None = None,
    pjrt_options: dict | None = None,
) -> None:
    """Sets options of the default client. Must be called before first use.

    ``num_cpu_devices``: number of CPU devices of the local host (default: the
    environment variable ``COLOCATED_NUM_CPU_DEVICES``, else the number of cores).

    ``pjrt_plugin``: a PJRT plugin whose devices join the CPU devices and
    become the default backend (``devices()``, ``default_backend()``):
    ``"cpu"`` for XLA's CPU plugin (the ``lammps-jax-pjrt-cpu`` package),
    ``"cuda"`` for the installed ``jax-cuda13-pjrt`` or ``jax-cuda12-pjrt``
    plugin, a name in JAX's ``PJRT_NAMES_AND_LIBRARY_PATHS``, or the plugin
    library's path. Default: the environment variable
    ``COLOCATED_PJRT_PLUGIN`` (a path or such a name), else none.
    ``pjrt_options``: the plugin client's create options (``{"cpu_device_count":
    4}`` for XLA's CPU plugin; the CUDA plugin's allocator options), values of
    type ``bool``, ``int``, ``float``, ``str`` or a list of ints.

    Raises ``FailedPreconditionError`` once the default client exists,
    ``InvalidArgumentError`` for a count that is not a positive integer or an
    option of another type, and ``NotFoundError`` for a plugin name that is
    not installed.
    """
    if num_cpu_devices is not None and (
        isinstance(num_cpu_devices, bool) or not isinstance(num_cpu_devices, int) or num_cpu_devices < 1
    ):
        raise InvalidArgumentError(f"num_cpu_devices must be a positive integer, got {num_cpu_devices!r}")
    if pjrt_options is not None and not isinstance(pjrt_options, dict):
        raise InvalidArgumentError(f"pjrt_options must be a dict, got {type(pjrt_options).__name__}")
    plugin = None if pjrt_plugin is None else find_pjrt_plugin(pjrt_plugin)
    options = None if pjrt_options is None else [(str(k), v) for k, v in pjrt_options.items()]
    # The rule (before first use) and the options are core's, shared by every SDK.
    _colocated.configure_default(num_cpu_devices, plugin, options)


#: Installed packages that carry a PJRT plugin, by the name ``configure``
#: takes: (module, library file in it), the first installed one wins.
_PLUGIN_PACKAGES = {
    "cpu": [("lammps_jax_pjrt_cpu", "pjrt_c_api_cpu_plugin.so")],
    "cuda": [
        ("jax_plugins.xla_cuda13", "xla_cuda_plugin.so"),
        ("jax_plugins.xla_cuda12", "xla_cuda_plugin.so"),
    ],
}
_PLUGIN_PACKAGES["gpu"] = _PLUGIN_PACKAGES["cuda"]


def find_pjrt_plugin(spec: str | os.PathLike) -> str:
    """The library of the PJRT plugin ``spec``: ``"cpu"`` or ``"cuda"``
    (``"gpu"``) find the installed package that carries it (XLA's CPU plugin;
    ``jax-cuda13-pjrt``, else ``jax-cuda12-pjrt``); a path is returned as it
    is; any other name is looked up in ``PJRT_NAMES_AND_LIBRARY_PATHS`` when
    the client is made.

    Raises ``NotFoundError`` naming the package to install when none is.
    """
    import importlib.util

    if not isinstance(spec, str):
        return os.fspath(spec)
    packages = _PLUGIN_PACKAGES.get(spec)
    if packages is None:
        return spec
    for module, library in packages:
        try:
            found = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            found = None
        if found is None or not found.submodule_search_locations:
            continue
        for location in found.submodule_search_locations:
            path = os.path.join(location, library)
            if os.path.exists(path):
                return path
    wheels = {"cpu": "lammps-jax-pjrt-cpu", "cuda": "jax-cuda13-pjrt", "gpu": "jax-cuda13-pjrt"}
    raise NotFoundError(f"no PJRT plugin for '{spec}' is installed: pip install {wheels[spec]}")


def connect(
    workers=None,
    *,
    cluster: str = "auto",
    token: str | None = None,
    token_file: str | os.PathLike | None = None,
    tls_ca: str | os.PathLike | bytes | None = None,
    tls_domain: str | None = None,
    include_local: bool = False,
    default: bool = True,
    timeout: float = 10.0,
    num_cpu_devices: int | None = None,
    port: int | None = None,
    service: str | None = None,
    replicas: int | None = None,
    namespace: str | None = None,
) -> _colocated.Client:
    """Connects to worker hosts and returns a client of them.

    ``workers``: ``"HOST:PORT"`` of each worker (``colocated worker`` or
    ``python -m colocated.worker``); worker ``i`` becomes process ``i + 1``.
    Without them, the workers are found as ``cluster`` says: ``"auto"`` looks
    at ``COLOCATED_WORKERS`` (comma-separated addresses), then the Slurm job
    (``SLURM_JOB_NODELIST``; the port is ``port``, else the job's, ``61440 +
    SLURM_JOB_ID % 4096``, which ``colocated worker --port auto`` listens on),
    then Kubernetes (the pods ``NAME-i.SERVICE.NAMESPACE.svc`` of a
    StatefulSet behind the headless Service ``service``, ``replicas`` of them;
    or ``COLOCATED_KUBERNETES_SERVICE`` and ``COLOCATED_KUBERNETES_REPLICAS``);
    ``"env"``, ``"slurm"`` or ``"kubernetes"`` looks there only. Nothing found
    raises ``NotFoundError`` saying where it looked. The
    token comes from ``token``, else ``token_file``, else the environment
    variable ``COLOCATED_TOKEN``; ``None`` of them connects without one (only an
    ``--insecure`` worker accepts that). ``tls_ca``: a PEM file (or its bytes)
    of the CA that signed the workers' certificates, which makes every
    connection TLS; ``tls_domain`` overrides the name checked in the worker's
    certificate. ``include_local`` makes this process a host too (process 0,
    with ``num_cpu_devices`` CPU devices). The client becomes the default one
    (``colocated.devices()``, ``device_put`` without a device, unpickled
    devices) unless ``default=False``. ``timeout``: how long to wait for each
    worker to answer, in seconds (workers that are still starting are waited
    for); the error names every worker that did not.

    Raises ``UnavailableError`` for a worker that cannot be reached,
    ``UnauthenticatedError`` for a refused token, ``InvalidArgumentError`` for
    bad arguments (both ``token`` and ``token_file``, an unreadable token file
    or an empty token).
    """
    if workers is None:
        addresses = []
    elif isinstance(workers, str):
        addresses = [workers]
    else:
        addresses = list(workers)
    for address in addresses:
        if not isinstance(address, str):
            raise InvalidArgumentError(f"worker addresses are 'HOST:PORT' strings, got {type(address).__name__}")
    ca = None
    if isinstance(tls_ca, bytes):
        ca = tls_ca
    elif tls_ca is not None:
        with open(tls_ca, "rb") as f:
            ca = f.read()
    c = _colocated.Client.connect(
        addresses,
        token=token,
        token_file=token_file,
        tls_ca=ca,
        tls_domain=tls_domain,
        include_local=include_local,
        timeout=timeout,
        num_cpu_devices=num_cpu_devices,
        cluster=cluster,
        port=port,
        service=service,
        replicas=replicas,
        namespace=namespace,
    )
    _register(c)
    if default:
        _set_default(c)
    return c


def _set_default(c: _colocated.Client | None) -> None:
    """Makes ``c`` the default client (``None``: the next use creates one)."""
    _colocated.set_default_client(c)


def _current_default() -> _colocated.Client | None:
    """The default client if there is one now, without creating one."""
    return _colocated.default_client(False)


def client() -> _colocated.Client:
    """The default client (the local host with CPU devices unless ``connect``
    made another one the default), created on first use: core's, asked each
    time (one wrapper per client)."""
    return _colocated.default_client()


def devices(backend: str | None = None) -> list[_colocated.Device]:
    """The devices of ``backend`` of the default client, in id order (as
    ``jax.devices()``): by default the default backend's (a PJRT plugin's when
    one is configured, else every CPU device); ``"cpu"`` gives the CPU devices
    colocated Python runs on.

    Raises ``NotFoundError`` for a backend the client does not have.
    """
    return client().devices(backend)


def default_backend() -> str:
    """The default backend's name (``jax.default_backend()``): a PJRT plugin's
    (its platform, such as ``"cuda"``; ``"pjrt_cpu"`` for XLA's CPU plugin)
    when one is configured, else ``"cpu"``."""
    return client().default_backend()


def local_devices() -> list[_colocated.Device]:
    """The devices this process can address, in id order (``jax.local_devices()``)."""
    return client().local_devices()


def _reduce_device(device_id: int, client_id: int) -> tuple:
    """A device's pickled form (its ``__reduce__``, a hook of the native
    module): resolved by ``_device_by_id`` in the same client when unpickled in
    this process, else in the default client."""
    return _device_by_id, (device_id, client_id, _PROCESS_NONCE)


def _device_by_id(device_id: int, client_id: int | None = None, nonce: int | None = None) -> _colocated.Device:
    """The device with this global id (used to unpickle devices): of client
    ``client_id`` when the device was pickled in this process and that client
    lives, else of the default client, as JAX resolves pickled devices (on a
    worker loading a controller's program, the id is the controller's, and
    names one of this host's devices: ``NotFoundError`` for another host's).

    Raises ``InvalidArgumentError`` (JAX's "Invalid device ID") when the client
    has no such device.
    """
    c = _CLIENTS.get(client_id) if nonce == _PROCESS_NONCE else None
    if c is None:
        c = client()
        # A worker loading a controller's program: the controller's ids name
        # this host's devices by their ids here.
        local = _colocated.controller_device_id(device_id)
        if local is not None:
            device_id = local
    try:
        return c.device(device_id)
    except NotFoundError:
        ids = [d.id for d in c.devices()]
        raise InvalidArgumentError(
            f"Invalid device ID {device_id}. The client has no such device (its device ids are {ids})"
        ) from None


def colocated_cpu_devices(devices_or_mesh):
    """Maps devices to the CPU devices of the same hosts, in order, in the
    devices' own client (any client, not only the default one).

    Takes a sequence of devices (returns a list) or a ``Mesh`` (returns a ``Mesh``
    of the same shape, axis names and axis types), as
    ``jax.experimental.colocated_python``. JAX's devices and meshes (of this
    process) give JAX's CPU devices and meshes: those that correspond to the
    CPU devices of the devices that correspond to them. Raises
    ``InvalidArgumentError`` for anything else, and for devices of several
    clients.
    """
    from ._jax import colocated_cpu_devices_of_jax, is_jax_devices
    from ._sharding import Mesh

    if is_jax_devices(devices_or_mesh):
        return colocated_cpu_devices_of_jax(devices_or_mesh)
    if isinstance(devices_or_mesh, Mesh):
        mesh = devices_or_mesh
        flat = _colocated.colocated_cpu_devices(list(mesh.devices.flat))
        return Mesh(_reshape(flat, mesh.devices.shape), mesh.axis_names, mesh.axis_types)
    devices = list(devices_or_mesh)
    for d in devices:
        if not isinstance(d, _colocated.Device):
            raise InvalidArgumentError(f"colocated_cpu_devices expects devices or a Mesh, got {type(d).__name__}")
    return _colocated.colocated_cpu_devices(devices)


def _reshape(flat, shape):
    import numpy as np

    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(shape)


def _after_fork_in_child() -> None:
    global _PROCESS_NONCE
    _colocated.after_fork_in_child()
    # What the parent pickled names the parent's clients, which the child cannot use.
    _PROCESS_NONCE = secrets.randbits(63)
    _CLIENTS.clear()
    # The parent's client is leaked by the native module (dropping it would touch
    # threads that do not exist in the child); the next use creates a fresh one.


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
