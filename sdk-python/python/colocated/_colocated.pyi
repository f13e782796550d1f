"""Type stubs of the native module ``colocated._colocated`` (private)."""

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ._errors import ColocatedError

PLATFORM_NAME: str
TOKEN_ENV: str  # the environment variable a token is read from
__version__: str

def after_fork_in_child() -> None:
    """Marks every runtime object made so far as belonging to the parent process."""

class Client:
    """A client: the in-process host with CPU devices, or (from ``connect``) worker
    hosts with, optionally, the in-process host."""

    def __init__(
        self,
        num_cpu_devices: int | None = None,
        executor_threads: int | None = None,
        pjrt_plugin: str | os.PathLike | None = None,
        pjrt_options: list[tuple[str, bool | int | float | str | list[int]]] | None = None,
    ) -> None:
        """A local client with ``num_cpu_devices`` CPU devices and, with
        ``pjrt_plugin`` (a library path), that PJRT plugin's devices."""
    @staticmethod
    def connect(
        addresses: list[str],
        *,
        token: str | None = None,
        token_file: str | os.PathLike | None = None,
        tls_ca: bytes | None = None,
        tls_domain: str | None = None,
        include_local: bool = False,
        timeout: float = 10.0,
        num_cpu_devices: int | None = None,
        executor_threads: int | None = None,
        cluster: str = "auto",
        port: int | None = None,
        service: str | None = None,
        replicas: int | None = None,
        namespace: str | None = None,
    ) -> Client:
        """Connects to the workers at ``addresses`` (else those ``cluster`` finds);
        worker ``i`` is process ``i + 1``. The token is ``token``, else the one in
        ``token_file``, else ``COLOCATED_TOKEN``'s."""
    def close(self) -> None:
        """Ends the sessions with this client's workers now: they free what they hold
        for it; work in flight there and later uses fail with ``CancelledError``."""
    def on_host_event(self, callback: Callable[[HostEvent], Any]) -> int:
        """Calls ``callback(event)`` with every event of the client's worker hosts
        from now on, in order, on a thread of the client's own (an exception it
        raises goes to ``sys.unraisablehook``), first with the loss of each host
        whose current session was lost before it came; returns the listener's id."""
    def remove_host_listener(self, listener_id: int) -> bool:
        """Stops calling listener ``listener_id``; False if it was not listening."""
    def host_stats(self, host: int) -> HostStats:
        """How often each host event happened to host ``host`` since the client started."""
    def hosts(self) -> list[Host]:
        """The hosts, in index order: the in-process host first when it is one."""
    @property
    def id(self) -> int:
        """An id of the client, unique in this process (not across processes)."""
    @property
    def platform_name(self) -> str:
        """Platform name of the runtime (``"colocated"``)."""
    @property
    def platform_version(self) -> str:
        """Version of the runtime."""
    @property
    def process_index(self) -> int:
        """Index of this (controller) process."""
    def devices(self, backend: str | None = None) -> list[Device]:
        """The devices of ``backend`` (default: the default backend's), in id
        order; ``"cpu"``: the CPU devices colocated Python runs on."""
    def default_backend(self) -> str:
        """A PJRT plugin's backend name when the client has one, else ``"cpu"``."""
    def local_devices(self) -> list[Device]:
        """The devices this process can address, in id order."""
    def device(self, id: int) -> Device:
        """The device with global id ``id``; ``NotFoundError`` if there is none."""
    def colocated_cpu_devices(self, devices: list[Device]) -> list[Device]:
        """Maps each device to the CPU device of the same host, in order."""

def colocated_cpu_devices(devices: list[Device]) -> list[Device]:
    """Maps each device to the CPU device of the same host, in order, in the
    devices' own client (``InvalidArgumentError`` for devices of several clients)."""

def configure_default(
    num_cpu_devices: int | None = None,
    pjrt_plugin: str | os.PathLike | None = None,
    pjrt_options: list[tuple[str, bool | int | float | str | list[int]]] | None = None,
) -> None:
    """Sets the options of the process's default client (before its first use)."""

def configure_worker_client(cpu_devices: int | None, pjrt_plugin: str | None, pjrt_options: list[str]) -> None:
    """Sets the default client's options from a worker's flags (``--cpu-devices``,
    ``--pjrt-plugin``, each ``--pjrt-option KEY=VALUE``)."""

def default_client(create: bool = True) -> Client | None:
    """The process's default client (core's), created on first use; with
    ``create=False``, None when there is none yet."""

def set_default_client(client: Client | None) -> None:
    """Makes ``client`` the process's default client (``None``: lets it go)."""

class Host:
    """A host of a client: the in-process host or a worker."""

    index: int
    process_index: int
    name: str
    device_ids: list[int]
    is_remote: bool

class HostEvent:
    """An event of a client's worker host: ``kind`` is ``"disconnected"``,
    ``"reconnected"``, ``"lost"`` or ``"reopened"``; ``error`` says why for
    ``"disconnected"`` and ``"lost"``."""

    host: int
    kind: str
    error: ColocatedError | None

class HostStats:
    """How often each host event happened to a host since the client started."""

    disconnects: int
    reconnects: int
    sessions_lost: int
    sessions_reopened: int

def load_plugin(client: Client, path: str) -> list[str]:
    """Loads a native-function plugin library into ``client``'s local host; returns
    the names it registered."""

def call_host_callback(index: int, data: bytes) -> bytes:
    """Calls host callback ``index`` of the program running on this thread (on the
    controller, when the program runs on a worker); waits without the GIL."""

def current_session() -> int:
    """The session of the colocated program running on this thread: on a worker,
    the key of the controller's session it runs for; 0 (the local session) for
    programs a process runs for its own client, and outside programs."""

class Device:
    """One device, as JAX shows it (``CpuDevice(id=0)``). Equal and hashed by id."""

    @property
    def id(self) -> int:
        """Global device id."""
    @property
    def platform(self) -> str:
        """Platform of the device (``"cpu"``; a PJRT plugin's, such as ``"cuda"``)."""
    @property
    def backend(self) -> str:
        """``"cpu"`` for the CPU devices colocated Python runs on; a PJRT plugin's backend name."""
    @property
    def device_kind(self) -> str:
        """Kind of the device (``"cpu"``; a plugin's, such as ``"NVIDIA H100 80GB HBM3"``)."""
    @property
    def process_index(self) -> int:
        """Index of the process (host) that owns the device."""
    @property
    def local_hardware_id(self) -> int:
        """Index of the device among its host's devices of the same kind."""
    @property
    def host_index(self) -> int:
        """Index of the owning host in the client's host list."""
    @property
    def attributes(self) -> dict[str, int | str | bool]:
        """Backend-defined attributes."""
    @property
    def default_memory_kind(self) -> str:
        """The kind of the memory space buffers go to unless told otherwise (``"device"``)."""
    @property
    def memory_kinds(self) -> list[str]:
        """The kinds of the memory spaces the device can address, default first."""
    def check_memory_kind(self, kind: str) -> None:
        """``InvalidArgumentError``, naming the kinds the device has, unless it
        addresses memory of kind ``kind``."""
    def debug_string(self) -> str:
        """Placement in words: ``cpu:3 (process 0, host 0, local 3)``."""
    def __hash__(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...

class Sharding:
    """A core sharding plus the client its devices belong to."""

    @staticmethod
    def named(
        devices: list[Device],
        mesh_shape: list[int],
        axis_names: list[str],
        partition: list[list[int]],
        axis_types: list[str] | None = None,
    ) -> Sharding:
        """A mesh of devices (row-major, one ``AxisType`` name per axis, default
        "Auto") and, per dimension, the mesh axes it is split over."""
    @staticmethod
    def single_device(device: Device) -> Sharding:
        """The whole array on one device, without a mesh."""
    @property
    def devices(self) -> list[Device]:
        """The devices in shard order, of the sharding's own client."""
    @property
    def device_ids(self) -> list[int]:
        """Device ids in shard order."""
    @property
    def mesh_shape(self) -> list[int]:
        """Mesh shape."""
    @property
    def axis_names(self) -> list[str]:
        """Mesh axis names."""
    @property
    def axis_types(self) -> list[str]:
        """Mesh axis types, one ``AxisType`` name per axis."""
    @property
    def is_single_device(self) -> bool:
        """True for one device's sharding made without a mesh."""
    @property
    def partition(self) -> list[list[int]]:
        """Per array dimension, the mesh axes it is split over."""
    @property
    def is_fully_replicated(self) -> bool:
        """True when every device holds the whole array."""
    def shard_shape(self, shape: list[int]) -> list[int]:
        """The shape each device holds; ``InvalidArgumentError`` for an uneven split."""
    def shard_indices(self, shape: list[int]) -> list[list[tuple[int, int]]]:
        """Per device, the ``(start, stop)`` range per dimension it holds."""
    def replicas(self, shape: list[int]) -> list[tuple[int, int]]:
        """Per device, ``(replica id, position of the first device holding the same
        slice)`` of an array of ``shape``."""
    def equivalent(self, other: Sharding, rank: int) -> bool:
        """Same devices in the same order, the same memory kind and the same
        split of every dimension."""
    @property
    def memory_kind(self) -> str | None:
        """The kind of memory the shards are in; None for each device's default."""
    def with_memory_kind(self, kind: str | None) -> Sharding:
        """This sharding with its shards in memory of ``kind`` (None: each
        device's default); ``InvalidArgumentError`` for a kind a device lacks."""
    def fitted(self, shape: list[int]) -> Sharding | None:
        """Where a fresh array of ``shape`` made like one of this sharding goes:
        None for this sharding itself (it splits ``shape``), else the array
        whole on each device of the same mesh."""

class CopyProgress:
    """Bytes of a copy that crossed hosts so far (updated by network threads)."""

    @property
    def done(self) -> int:
        """Bytes that arrived so far."""
    @property
    def total(self) -> int:
        """Bytes in all (0 until the first report)."""

class Event:
    """A one-shot future of the runtime."""

    def __init__(self) -> None:
        """A pending event that the caller fulfils with ``set``."""
    def set(self, code: str | None = None, message: str = "") -> None:
        """Fulfils the event with success, or with an error of ``code`` and ``message``."""
    @staticmethod
    def join(events: list[Event]) -> Event:
        """Ready when all are; fails with the first error in argument order."""
    def is_ready(self) -> bool:
        """True once the event has its result."""
    def wait(self) -> None:
        """Blocks (without the GIL) until ready; raises the event's error."""
    def wait_timeout(self, timeout: float) -> None:
        """Blocks at most ``timeout`` seconds; ``DeadlineExceededError`` if still pending."""
    def error(self) -> BaseException | None:
        """The error as an exception instance, or None."""
    def on_ready(self, callback: Callable[[BaseException | None], Any]) -> None:
        """Calls ``callback(None | exception)`` exactly once, possibly on a runtime thread."""

class HostView:
    """A pinned read-only view of one buffer's bytes (numpy array interface)."""

    def __len__(self) -> int: ...
    @property
    def __array_interface__(self) -> dict[str, Any]:
        """A read-only uint8 vector over the pinned bytes."""

class ArrayImpl:
    """The native half of ``colocated.Array``."""

    @staticmethod
    def from_host_bytes(
        sharding: Sharding, dtype: str, shape: list[int], ptr: int, nbytes: int, memory_kind: str | None = None
    ) -> ArrayImpl:
        """Splits row-major host bytes of the global array over the sharding's devices,
        into their memory of kind ``memory_kind`` (default: their default memory)."""
    @staticmethod
    def from_host_view(
        sharding: Sharding,
        dtype: str,
        shape: list[int],
        ptr: int,
        nbytes: int,
        owner: object,
        memory_kind: str | None = None,
    ) -> ArrayImpl:
        """An array of one buffer reading the bytes in place where the runtime can
        (a CPU device of this process), keeping ``owner`` until it lets go of them;
        copied for any other device, and like ``from_host_bytes`` for several."""
    @staticmethod
    def from_device_dlpack(sharding: Sharding, dtype: str, shape: list[int], capsule: object) -> ArrayImpl:
        """An array of one buffer on a GPU plugin's device that views the device
        memory behind a DLPack capsule of another library's array on that device
        (checked: device, dtype, shape, dense row-major), keeping the capsule
        until the plugin lets go of it."""
    @staticmethod
    def from_bytes(
        sharding: Sharding, dtype: str, shape: list[int], data: bytes, memory_kind: str | None = None
    ) -> ArrayImpl:
        """Like ``from_host_bytes``, from a ``bytes`` object (small values)."""
    @staticmethod
    def from_host_strings(
        sharding: Sharding, shape: list[int], strings: list[str], memory_kind: str | None = None
    ) -> ArrayImpl:
        """Splits row-major strings of the global array over the sharding's devices."""
    @staticmethod
    def from_host_shards(
        sharding: Sharding,
        dtype: str,
        shape: list[int],
        shards: list[tuple[int, int]],
        memory_kind: str | None = None,
    ) -> ArrayImpl:
        """One dense host shard ``(ptr, nbytes)`` per device, in the sharding's order."""
    @staticmethod
    def from_string_shards(
        sharding: Sharding, shape: list[int], shards: list[list[str]], memory_kind: str | None = None
    ) -> ArrayImpl:
        """One row-major list of strings per device, in the sharding's order."""
    @staticmethod
    def assemble(
        sharding: Sharding, dtype: str, shape: list[int], arrays: list[ArrayImpl], memory_kind: str | None = None
    ) -> ArrayImpl:
        """Assembles single-device arrays, one per device of the sharding, matched
        by device (each in memory of kind ``memory_kind``, when given)."""
    def put_to(self, sharding: Sharding, memory_kind: str | None = None) -> tuple[ArrayImpl | None, CopyProgress]:
        """The array on ``sharding`` (in memory of kind ``memory_kind``), as
        ``device_put`` places an array: as it is when laid out that way already
        (then ``None``: the caller keeps its own object),
        shard by shard host to host when each shard keeps its index, else
        gathered and put again in the background (either way at once, ready
        later); and the bytes that crossed hosts so far."""
    def device_dlpack(self, i: int) -> object | None:
        """A DLPack capsule of shard ``i``'s device memory on a GPU plugin's
        device, pinned until its consumer is done; None for a plugin layout
        that is not dense row-major. Waits without the GIL."""
    def shard_bytes(self, i: int) -> bytes:
        """Shard ``i``'s bytes, copied; waits without the GIL."""
    @property
    def memory_kind(self) -> str:
        """The kind of memory the shards are in."""
    @property
    def shape(self) -> tuple[int, ...]:
        """Global shape."""
    @property
    def dtype(self) -> str:
        """Element type name."""
    @property
    def np_dtype(self) -> np.dtype:
        """Element type as a numpy dtype."""
    def small_value(self) -> np.ndarray | np.generic | None:
        """The value of a small one-buffer dense array as a fresh numpy value (a
        scalar for rank 0), or None when the array is split, large or strings."""
    def small_like(self, value: np.ndarray | np.generic) -> ArrayImpl | None:
        """A small numpy result as an array laid out like this one-buffer array,
        or None when it does not qualify."""
    def scalar_op(self, op: Callable[[object, object], object], other: object, reflected: bool) -> ArrayImpl | None:
        """``op(value, other)`` (``op(other, value)`` when ``reflected``) for a small
        one-buffer array and a Python scalar, or None when it does not qualify.
        ``+``, ``-``, ``*`` and ``/`` on integer and float arrays are computed
        without numpy wherever numpy would give the same result and no warning."""
    @property
    def sharding(self) -> Sharding:
        """The core sharding."""
    @property
    def num_shards(self) -> int:
        """Number of shards."""
    @property
    def on_workers(self) -> bool:
        """True when some shard lives on a worker host."""
    def shard(self, i: int) -> ArrayImpl:
        """Shard ``i`` as a single-device array sharing its buffer."""
    def shard_index(self, i: int) -> list[tuple[int, int]]:
        """The ``(start, stop)`` range per dimension that shard ``i`` holds."""
    def ready_event(self) -> Event:
        """Ready when every shard is."""
    def is_ready(self) -> bool:
        """True when every shard is ready."""
    def block_until_ready(self) -> None:
        """Blocks (without the GIL) until every shard is ready."""
    def delete(self) -> None:
        """Deletes every shard."""
    def is_deleted(self) -> bool:
        """True when any shard was deleted."""
    def host_view(self, i: int) -> HostView | None:
        """Waits for shard ``i`` and pins its bytes; ``None`` when they are not
        its dense row-major bytes (a plugin's own layout)."""
    def to_host_into(self, ptr: int, nbytes: int) -> None:
        """Gathers the array row-major into ``nbytes`` at ``ptr``."""
    def to_host_strings(self) -> list[str]:
        """Gathers a string array's elements row-major."""

def flat_tree_key(n: int) -> int:
    """Core's tree key of a call of ``n`` positional arrays and no keywords."""

def new_tree_key() -> int:
    """A tree key no structure has yet (core's interner), for a new treedef."""

class FunctionState:
    """Controller-side state of a colocated function: the runtime's colocated
    function (call rules, cache of compiled programs per input spec, discovery)."""

    def __init__(
        self,
        name: str,
        devices: list[Device] | None = None,
        in_specs: tuple[int, list[tuple[str, list[int], Sharding]]] | None = None,
    ) -> None: ...
    def call(self, args: tuple[object, ...], kwargs: dict[str, object] | None = None) -> object:
        """The whole call natively when its arguments are positional Arrays and a
        program is cached for their spec; ``NotImplemented`` otherwise."""
    def call_general(
        self, tree: int, arrays: list[ArrayImpl], site: object, objects: list[ColocatedObject] = ...
    ) -> tuple[object, Event | None]:
        """Any call: the cached program, one compiled for ``site.declared()``, or a
        synchronous discovery run. Returns the result tree and the status (None
        when it already finished)."""
    def compile_ahead(self, tree: int, specs: list[tuple[str, list[int], Sharding]], site: object) -> Executable:
        """Compiles the program for the call spec ahead of a call, with declared outputs."""
    def cache_info(self) -> tuple[int, int, int]: ...
    def clear(self) -> None: ...

class ProgramCache:
    """Core's cache of one program per call spec, for programs the SDK makes
    itself (``colocated.jit``'s): a tree key and the input arrays' specs."""

    def __init__(self) -> None: ...
    def get(self, tree: int, arrays: list[ArrayImpl]) -> object | None:
        """The program for ``tree`` and the arrays' specs, or None (counted)."""
    def insert(self, tree: int, arrays: list[ArrayImpl], program: object) -> None:
        """Keeps ``program`` for ``tree`` and the arrays' specs."""
    def info(self) -> tuple[int, int, int]:
        """``(hits, misses, size)``."""
    def clear(self) -> None:
        """Drops every program and resets the counts."""

class ColocatedObject:
    """A colocated object's handle: dropping it destroys the object on every host
    it ran on, after the calls already made on it."""

    def __init__(self, obj_id: int | None = None) -> None:
        """A new object, or with ``obj_id`` a new handle of that existing object
        (in a forked child, which cannot use its parent's handles)."""
    @property
    def id(self) -> int:
        """The object's id on its hosts (see ``host_object``)."""
    @property
    def usable(self) -> bool:
        """False in a child forked after the handle was made."""

def host_object(obj_id: int, build: Callable[[], object]) -> object:
    """The object ``obj_id`` of the running program's session on this host, built
    by ``build()`` on first use; a constructor's exception is raised again."""

def controller_device_id(id: int) -> int | None:
    """This host's id of the controller's device ``id`` while a worker loads that
    controller's program (None otherwise); ``NotFoundError`` for another host's."""

def host_objects(every_session: bool = False) -> int:
    """Objects the running program's session (or every session) holds on this host."""

def parked_results(every_session: bool = False) -> int:
    """Discovery results the running program's session (or every session) has
    parked on this host."""

def local_values() -> int:
    """Values (callables of this process run by reference) core's registry holds now."""

class LocalProgram:
    """A host callable of this process in core's registry of local values: its
    own host runs it by reference while this handle or a program loaded from
    its reference lives."""

    def __init__(self, callable: object) -> None: ...
    @property
    def reference(self) -> bytes:
        """The program payload that names the callable (on this process only)."""

class FunctionBase:
    """Native base of ``ColocatedFunction``: its ``__call__`` runs the fast path
    of ``FunctionState.call`` (with the ``_state`` attribute) and leaves other
    calls to ``_call_general(args, kwargs)``."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

class Executable:
    """A compiled colocated Python program."""

    @staticmethod
    def compile(
        name: str,
        payload: bytes,
        input_specs: list[tuple[str, list[int], Sharding]],
        output_specs: list[tuple[str, list[int], Sharding]],
        devices: list[Device],
        host_callbacks: list[Callable[[bytes], bytes]] = ...,
    ) -> Executable: ...
    @staticmethod
    def compile_stablehlo(module: bytes, devices: list[Device]) -> Executable:
        """Compiles a StableHLO module (MLIR text) for devices of a PJRT plugin."""
    @staticmethod
    def deserialize_and_load(data: bytes, client: Client) -> Executable:
        """Loads bytes of ``serialize()`` on ``client``."""
    def devices(self) -> list[Device]:
        """The devices the program runs on."""
    def execute(self, arrays: list[ArrayImpl]) -> tuple[list[ArrayImpl], Event]: ...
    def call(self, arrays: list[ArrayImpl]) -> list[ArrayImpl]:
        """``execute`` without the status: the outputs only."""
    def serialize(self) -> bytes:
        """The portable bytes of the executable."""

class WorkerHandle:
    """A worker serving this process's devices (see ``start_worker``)."""

    @property
    def address(self) -> str:
        """``HOST:PORT`` the worker listens on."""
    @property
    def idle_expired(self) -> bool:
        """True once the worker has had no session for ``exit_after_idle`` seconds
        (a ``single_session`` worker: once its session ended)."""
    def shutdown(self) -> None:
        """Stops serving and closes every session (idempotent)."""

def worker_flags() -> list[tuple[str, str, str | None, bool, str, list[str], bool]]:
    """The flags of a worker's command line, from the runtime's table (which
    ``colocated worker`` is built from too): ``(name, kind, default, repeatable,
    help, aliases, hidden)``, ``kind`` one of ``switch``, ``address``, ``count``, ``seconds``, ``path``, ``port``,
    ``name``; ``hidden`` for the flags help leaves out."""

def status_flags() -> list[tuple[str, str, str | None, bool, str, list[str], bool]]:
    """The flags of ``colocated status`` after its addresses, from the runtime's
    table (as ``worker_flags``)."""

def status(
    addresses: list[str],
    *,
    token_file: str | os.PathLike | None = None,
    tls_ca: str | os.PathLike | None = None,
    tls_domain: str | None = None,
    timeout: float,
    cluster: str,
    port: str | None = None,
) -> tuple[str, bool]:
    """``colocated status``: one line per worker (those given, else those found as
    ``cluster`` says), and whether all answered."""

class WorkerConfig:
    """A worker's options, checked: made from the values of the worker flags by
    the runtime's rules, as ``colocated worker`` makes them
    (``InvalidArgumentError`` naming a bad flag), for a Python worker started by
    ``command`` (the program, then the arguments before the flags). As the
    Python code controllers send runs there, each session runs in a worker
    process of its own, started by ``command``, unless ``shared_sessions``.
    With ``single_session``, ``token_file`` holds a one-time token, read here
    and deleted."""

    def __init__(
        self,
        *,
        command: list[str],
        listen: str,
        port: str | None = None,
        token_file: str | os.PathLike | None = None,
        insecure: bool = False,
        tls_cert: str | os.PathLike | None = None,
        tls_key: str | os.PathLike | None = None,
        heartbeat_interval: float,
        session_timeout: float,
        exit_after_idle: float | None = None,
        cpu_devices: int | None = None,
        pjrt_plugin: str | None = None,
        pjrt_options: list[str] | None = None,
        plugins: list[str | os.PathLike] | None = None,
        trace: str | os.PathLike | None = None,
        isolate_sessions: bool = False,
        shared_sessions: bool = False,
        single_session: bool = False,
    ) -> None: ...
    @property
    def trace_file(self) -> str | None:
        """This process's own trace file (``--trace``; a session worker's is ``NAME.PID.EXT``)."""
    @property
    def single_session(self) -> bool:
        """True for a session worker: it serves one session."""

def start_worker(client: Client, config: WorkerConfig) -> WorkerHandle:
    """Starts a worker serving ``client`` (native and Python programs) as
    ``config`` says: a supervisor that runs each session in a worker process of
    its own and redirects the controller there, unless sessions are shared.
    With ``exit_after_idle``, ``WorkerHandle.idle_expired`` becomes true once the
    worker has had no session for that many seconds (a session worker's: once
    its one session ended, none opened within the handshake deadline, or its
    stdin closed)."""

def init_worker_logging(trace: str | None = None) -> None:
    """Logs to stderr what ``COLOCATED_LOG`` selects, else colocated's warnings (a
    worker's default), and sets up the worker's tracing: ``COLOCATED_TRACE`` is
    ignored (it names the controller's file; this worker's spans go to the
    controllers that trace), ``trace`` (``--trace FILE``) receives this worker's
    own trace. Call before anything else uses colocated."""

def native_scalar_ops() -> int:
    """How many operator results on small arrays were computed without numpy
    so far. Only in builds with the ``testing`` feature (``make python``)."""

class RemoteSession:
    """A controller's session on one worker (low level): buffers by handle,
    executables, executions. Network waits release the GIL.
    Only in builds with the ``testing`` feature (``make python``), for tests.
    """

    def __init__(
        self, address: str, *, token: str | None = None, timeout: float = 10.0, tls_ca: bytes | None = None
    ) -> None: ...
    def devices(self) -> list[tuple[int, str]]:
        """The worker's devices: ``(local id, kind)``."""
    def languages(self) -> list[str]:
        """The program languages the worker runs."""
    def new_handle(self) -> int:
        """A handle unused in this session."""
    def put_buffer(self, handle: int, device: int, dtype: str, dims: list[int], data: bytes) -> None:
        """Uploads row-major bytes as a buffer of the session."""
    def get_buffer(self, handle: int) -> bytes:
        """The bytes of a buffer of the session (waits until it is ready)."""
    def load_executable(self, handle: int, executable: bytes) -> tuple[int, int]:
        """Loads a serialized executable; returns (input buffers, output buffers)."""
    def execute(self, executable: int, inputs: list[int], outputs: list[int], stream: int) -> None:
        """Queues an execution on the worker."""
    def execute_async(self, executable: int, inputs: list[int], outputs: list[int], stream: int) -> None:
        """Queues an execution on the ordered control stream, without waiting."""
    def flush(self) -> None:
        """Waits until the worker took every queued operation; raises the first refusal."""
    def close(self) -> None:
        """Closes the session (idempotent)."""
