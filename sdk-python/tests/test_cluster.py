"""A controller driving real ``python -m colocated.worker`` processes on 127.0.0.1
through ``colocated.connect``: arrays sharded across hosts, colocated functions
and classes on every host, host callbacks from workers, authentication and lost
workers."""

import gc
import itertools
import os
import signal
import sys
import threading
import time

import cloudpickle
import numpy as np
import pytest
from workers import Worker

import colocated
from colocated import _client

# Functions of this module travel by value: the workers cannot import it.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

def sharded_arange(n, devices, dtype=np.int32):
    mesh = colocated.Mesh(devices, ("x",))
    return colocated.device_put(np.arange(n, dtype=dtype), colocated.NamedSharding(mesh, colocated.P("x")))


def eventually(what, predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.02)


def test_connect_gives_global_devices_that_report_their_host(cluster):
    client, workers = cluster(2, devices=3)
    assert [d.id for d in client.devices()] == list(range(6))
    assert [d.process_index for d in client.devices()] == [1, 1, 1, 2, 2, 2]
    assert colocated.devices() == client.devices()
    hosts = client.hosts()
    assert [h.name for h in hosts] == [w.address for w in workers]
    assert [h.device_ids for h in hosts] == [[0, 1, 2], [3, 4, 5]]
    assert all(h.is_remote for h in hosts)


def test_an_array_over_three_hosts_runs_once_per_host_with_its_shards(cluster):
    client, workers = cluster(3)
    x = sharded_arange(12, client.devices())

    @colocated.colocated_python
    def add_one(x):
        return x + 1

    @colocated.colocated_python
    def pid_of(x):
        # Each host's part: its two shards, filled with the worker's pid.
        assert x.shape == (4,), x.shape
        return x * 0 + os.getpid()

    y = add_one(x)
    assert y.sharding == x.sharding
    np.testing.assert_array_equal(np.asarray(y), np.arange(12) + 1)
    # Later calls are asynchronous and take the compiled program.
    np.testing.assert_array_equal(np.asarray(add_one(y)), np.arange(12) + 2)
    assert add_one.cache_info().hits == 1
    pids = np.asarray(pid_of(x))
    assert pids.tolist() == [w.pid for w in workers for _ in range(4)]


def test_a_colocated_class_is_built_lazily_per_host_and_destroyed_on_each(cluster, tmp_path):
    client, workers = cluster(2)
    marks = str(tmp_path / "marks")
    os.mkdir(marks)

    @colocated.colocated_python_class
    class Counter:
        def __init__(self, start):
            self.count = start
            open(os.path.join(marks, f"built-{os.getpid()}"), "w").close()

        def add(self, x):
            self.count += 1
            return x + self.count

        def __del__(self):
            open(os.path.join(marks, f"destroyed-{os.getpid()}"), "w").close()

    x = sharded_arange(4, client.devices())
    counter = Counter(10)
    assert not os.listdir(marks)  # lazy: nothing built before a call
    np.testing.assert_array_equal(np.asarray(counter.add(x)), np.arange(4) + 11)
    np.testing.assert_array_equal(np.asarray(counter.add(x)), np.arange(4) + 12)
    assert sorted(os.listdir(marks)) == sorted(f"built-{w.pid}" for w in workers)
    del counter
    gc.collect()
    expected = {f"destroyed-{w.pid}" for w in workers}
    eventually("both hosts destroyed the object", lambda: expected <= set(os.listdir(marks)))


def test_an_argument_less_function_specialized_with_devices_runs_once_per_worker(cluster):
    client, workers = cluster(2, devices=2)

    def block():
        # Each host makes its block over its own devices of the call.
        mesh = colocated.Mesh(colocated.devices(), ("x",))
        return colocated.device_put(np.array([os.getpid(), 7], np.int64), colocated.NamedSharding(mesh, colocated.P("x")))

    make = colocated.colocated_python(block).specialize(devices=client.devices())
    y = make()
    # The hosts' blocks, stacked in host order, over every device of the call.
    assert y.shape == (4,)
    assert [d.id for d in y.sharding._device_assignment] == [0, 1, 2, 3]
    assert np.asarray(y).tolist() == [workers[0].pid, 7, workers[1].pid, 7]
    # Later calls take the compiled program, asynchronously.
    assert np.asarray(make()).tolist() == [workers[0].pid, 7, workers[1].pid, 7]
    assert make.cache_info().hits == 1
    with pytest.raises(colocated.InvalidArgumentError, match="must be first specialized with devices"):
        colocated.colocated_python(block)()


def test_an_output_with_a_sharding_the_function_makes_gets_a_global_spec(cluster):
    client, _ = cluster(2, devices=2)
    x = sharded_arange(4, client.devices())
    axis = "y"  # captured by the function

    @colocated.colocated_python
    def reversed_mesh(x):
        # The host's devices in reverse order: the sharding of none of the inputs.
        mesh = colocated.Mesh(x.sharding.mesh.devices[::-1], (axis,))
        return colocated.device_put(np.asarray(x) * 10, colocated.NamedSharding(mesh, colocated.P(axis)))

    y = reversed_mesh(x)
    assert y.shape == (4,)
    assert [d.id for d in y.sharding._device_assignment] == [1, 0, 3, 2]
    assert y.sharding.spec == colocated.P(axis)
    # Host 0 put [0, 10] on devices 1 and 0, host 1 [20, 30] on devices 3 and 2.
    assert np.asarray(y).tolist() == [0, 10, 20, 30]
    assert [int(np.asarray(s.data)[0]) for s in sorted(y.addressable_shards, key=lambda s: s.device.id)] == [
        10, 0, 30, 20,
    ]

    # On one host an output with any sharding over its devices is global as it is.
    one = sharded_arange(2, client.devices()[2:])
    z = reversed_mesh(one)
    assert [d.id for d in z.sharding._device_assignment] == [3, 2]
    assert np.asarray(z).tolist() == [0, 10]


def _output_sharding_case(case, devs):
    """(input sharding, sharding the function puts its output on) over two
    devices: outputs with the layout of the input or of none, with other mesh
    names, axis types, meshes over one device and memory kinds."""
    P, Mesh, NamedSharding = colocated.P, colocated.Mesh, colocated.NamedSharding
    on_x = NamedSharding(Mesh(devs[:2], ("x",)), P("x"))
    two_axes = Mesh(np.array(devs[:2]).reshape(2, 1), ("a", "b"))
    explicit = Mesh(devs[:2], ("x",), (colocated.AxisType.Explicit,))
    return {
        # The function: a one-device mesh of its own, from a single
        # device's input (the same layout).
        "one_device_mesh": (colocated.SingleDeviceSharding(devs[0]), NamedSharding(Mesh(devs[:1], ["x"]), P())),
        "single_device": (NamedSharding(Mesh(devs[:1], ["x"]), P()), colocated.SingleDeviceSharding(devs[0])),
        "two_axes": (on_x, NamedSharding(two_axes, P("a"))),
        "two_axes_pinned": (on_x, NamedSharding(two_axes, P("a"), memory_kind="pinned_host")),
        "explicit": (on_x, NamedSharding(explicit, P("x"))),
        "unpinned": (on_x, on_x.with_memory_kind("unpinned_host")),
        "input_sharding": (on_x, on_x),
        "explicit_input": (NamedSharding(explicit, P("x")), NamedSharding(explicit, P("x"))),
        "explicit_input_renamed": (NamedSharding(explicit, P("x")), NamedSharding(two_axes, P("a"))),
        "other_layout": (on_x, NamedSharding(two_axes, P())),
    }[case]


_OUTPUT_SHARDING_CASES = [
    "one_device_mesh", "single_device", "two_axes", "two_axes_pinned", "explicit", "unpinned", "input_sharding",
    "explicit_input", "explicit_input_renamed", "other_layout",
]


def _devices_of(where, cluster):
    if where == "local":
        return colocated.devices()
    client, _ = cluster(1, devices=2)
    return client.devices()


@pytest.mark.parametrize("case", _OUTPUT_SHARDING_CASES)
@pytest.mark.parametrize("where", ["local", "worker"])
def test_an_output_keeps_the_sharding_the_function_made(where, case, cluster):
    s_in, s_out = _output_sharding_case(case, _devices_of(where, cluster))
    x = colocated.device_put(np.arange(4, dtype=np.int32), s_in)

    @colocated.colocated_python
    def g(x):
        return colocated.device_put(np.asarray(x) * 2, s_out)

    y = g(x)  # discovered
    assert y.sharding == s_out
    assert y.sharding.memory_kind == s_out.memory_kind
    assert np.asarray(y).tolist() == [0, 2, 4, 6]
    assert g(x).sharding == s_out  # the compiled program's


@pytest.mark.parametrize("case", _OUTPUT_SHARDING_CASES)
@pytest.mark.parametrize("where", ["local", "worker"])
def test_an_output_keeps_its_sharding_in_the_next_call(where, case, cluster):
    s_in, s_out = _output_sharding_case(case, _devices_of(where, cluster))
    x = colocated.device_put(np.arange(4, dtype=np.int32), s_in)

    @colocated.colocated_python
    def g(x):
        return colocated.device_put(np.asarray(x) * 2, s_out)

    @colocated.colocated_python
    def h(y):
        # On the host, the array has the sharding it was made with.
        if y.sharding != s_out:
            raise AssertionError(f"the host sees {y.sharding!r}, not {s_out!r}")
        return y + 1

    z = h(g(x))
    assert z.sharding == s_out
    assert np.asarray(z).tolist() == [1, 3, 5, 7]


@pytest.mark.parametrize("case", _OUTPUT_SHARDING_CASES)
@pytest.mark.parametrize("where", ["local", "worker"])
def test_out_specs_fn_gives_its_outputs_the_declared_sharding(where, case, cluster):
    s_in, s_out = _output_sharding_case(case, _devices_of(where, cluster))
    x = colocated.device_put(np.arange(4, dtype=np.int32), s_in)

    @colocated.colocated_python
    def g(x):
        # On the host, the input has the sharding it was given.
        if x.sharding != s_in:
            raise AssertionError(f"the host sees {x.sharding!r}, not {s_in!r}")
        return colocated.device_put(np.asarray(x) * 2, s_out)

    g = g.specialize(out_specs_fn=lambda x: colocated.ShapeDtypeStruct(x.shape, x.dtype, s_out))
    y = g(x)
    assert y.sharding == s_out
    assert np.asarray(y).tolist() == [0, 2, 4, 6]


def test_copies_on_several_workers_with_an_inputs_layout_join_as_that_input(cluster):
    client, _ = cluster(2, devices=2)
    mesh = colocated.Mesh(client.devices(), ("x",))
    x = colocated.device_put(np.arange(4, dtype=np.int32), colocated.NamedSharding(mesh, colocated.P()))

    @colocated.colocated_python
    def copy(x):
        # Each host's copy over its devices, on a mesh of another name: no
        # blocks of one array, but the input's layout.
        own = colocated.Mesh(x.sharding.mesh.devices, ("r",))
        return colocated.device_put(np.asarray(x) + 1, colocated.NamedSharding(own, colocated.P()))

    y = copy(x)
    assert y.sharding.is_equivalent_to(x.sharding, 1)
    assert np.asarray(y).tolist() == [1, 2, 3, 4]


def test_a_sharding_captured_in_a_function_names_the_workers_devices(cluster):
    client, _ = cluster(2, devices=2)
    second = client.devices()[2:]  # the second worker's, which calls them 0 and 1
    captured = colocated.NamedSharding(colocated.Mesh(second[::-1], ("y",)), colocated.P("y"))

    @colocated.colocated_python
    def onto_captured(x):
        return colocated.device_put(np.asarray(x) * 10, captured)

    y = onto_captured(sharded_arange(2, second))
    assert [d.id for d in y.sharding._device_assignment] == [3, 2]
    assert np.asarray(y).tolist() == [0, 10]
    assert y.sharding.spec == colocated.P("y")

    # A device of another host cannot be captured for this one.
    elsewhere = colocated.SingleDeviceSharding(client.devices()[0])

    @colocated.colocated_python
    def onto_elsewhere(x):
        return colocated.device_put(np.asarray(x), elsewhere)

    with pytest.raises(colocated.ColocatedError, match="device 0 of the controller is not on this host"):
        onto_elsewhere(sharded_arange(2, second))


def test_discovery_on_workers_refuses_results_that_differ_between_hosts(cluster):
    client, workers = cluster(2)
    x = sharded_arange(4, client.devices())
    first = workers[0].pid

    @colocated.colocated_python
    def two_shapes(x):
        return {"x": x} if os.getpid() == first else [x]

    with pytest.raises(colocated.InvalidArgumentError, match="different structures on different hosts"):
        two_shapes(x)

    @colocated.colocated_python
    def two_lengths(x):
        return colocated.device_put(np.zeros(3 if os.getpid() == first else 5, np.int32), x.sharding.mesh.devices[0])

    with pytest.raises(colocated.InvalidArgumentError, match="output 0 differs"):
        two_lengths(x)

    @colocated.colocated_python
    def parked(x):
        from colocated import _colocated

        return x * 0 + _colocated.parked_results()

    np.testing.assert_array_equal(np.asarray(parked(x)), [0, 0, 0, 0])


def test_workers_results_compare_as_trees_and_keep_their_shardings_details(cluster):
    client, workers = cluster(2)
    x = sharded_arange(4, client.devices())
    first = workers[0].pid

    @colocated.colocated_python
    def keyed(x):
        # The same dict, built in another order on each host.
        keys = ["a", "b"] if os.getpid() == first else ["b", "a"]
        return {k: x for k in keys}

    out = keyed(x)
    assert sorted(out) == ["a", "b"]
    np.testing.assert_array_equal(np.asarray(out["a"]), np.arange(4))

    @colocated.colocated_python
    def pinned(x):
        mesh = colocated.Mesh(x.sharding.mesh.devices, ("x",), (colocated.AxisType.Explicit,))
        return colocated.device_put(np.asarray(x), colocated.NamedSharding(mesh, colocated.P("x"), memory_kind="pinned_host"))

    y = pinned(x)
    assert y.sharding.memory_kind == "pinned_host"
    assert y.sharding.mesh.axis_types == (colocated.AxisType.Explicit,)
    assert [d.id for d in y.sharding._device_assignment] == [d.id for d in x.sharding._device_assignment]

    @colocated.colocated_python
    def same_everywhere(x):
        # Each host's copy over its devices: not blocks of one array.
        mesh = colocated.Mesh(x.sharding.mesh.devices, ("x",))
        return colocated.device_put(np.int32(os.getpid()), colocated.NamedSharding(mesh, colocated.P()))

    with pytest.raises(colocated.InvalidArgumentError, match="splits no dimension over its first mesh axis"):
        same_everywhere(x)


class _PickleCounter:
    """Counts how often it is pickled (on the controller) by a class-level
    counter; a worker unpickles a fresh one."""

    pickled = 0

    def __reduce__(self):
        _PickleCounter.pickled += 1
        return (_PickleCounter, ())


def test_a_first_call_on_workers_pickles_its_function_once_and_each_result_is_checked(cluster, tmp_path):
    client, _workers = cluster(2)
    x = sharded_arange(4, client.devices())
    counter = _PickleCounter()
    # Another structure once the first call discovered one.
    flag = tmp_path / "tuple"

    @colocated.colocated_python
    def restructures(x):
        assert counter is not None
        return (x,) if flag.exists() else x

    _PickleCounter.pickled = 0
    np.testing.assert_array_equal(np.asarray(restructures(x)), np.arange(4))
    # The discovery run and the program compiled after it run one payload.
    assert _PickleCounter.pickled == 1
    np.testing.assert_array_equal(np.asarray(restructures(x)), np.arange(4))
    assert _PickleCounter.pickled == 1
    flag.touch()
    with pytest.raises(colocated.RemoteError, match="another structure than its program's") as err:
        np.asarray(restructures(x))
    assert err.value.code == "invalid_argument"


def test_out_specs_fn_runs_asynchronously_on_workers(cluster):
    client, workers = cluster(2)
    x = sharded_arange(4, client.devices())

    @colocated.colocated_python
    def pid_of(x):
        return x * 0 + os.getpid()

    pid_of = pid_of.specialize(out_specs_fn=lambda x: x)
    y = pid_of(x)  # compiled from the declared specs, no discovery run
    assert y.sharding == x.sharding
    assert np.asarray(y).tolist() == [workers[0].pid] * 2 + [workers[1].pid] * 2
    assert pid_of.cache_info().misses == 1


def test_a_constructor_that_raised_on_a_worker_raises_again_on_every_call(cluster, tmp_path):
    client, _ = cluster(1)
    marks = str(tmp_path / "marks")
    os.mkdir(marks)

    @colocated.colocated_python_class
    class Fragile:
        def __init__(self):
            open(os.path.join(marks, f"attempt-{time.monotonic_ns()}"), "w").close()
            raise RuntimeError("no such device file")

        def echo(self, x):
            return x

    obj = Fragile()
    x = sharded_arange(2, client.devices())
    for _ in range(3):
        with pytest.raises(colocated.ColocatedError, match="no such device file"):
            obj.echo(x)
    assert len(os.listdir(marks)) == 1, "built once; its error kept"


def test_host_callbacks_run_in_the_controller(cluster):
    client, workers = cluster(2)
    seen = []

    @colocated.host_callback
    def record(pid, total):
        seen.append((pid, total, os.getpid()))
        return total * 2

    @colocated.host_callback
    def refuse():
        raise PermissionError("the controller says no")

    @colocated.colocated_python
    def report(x):
        doubled = record(os.getpid(), int(np.asarray(x).sum()))
        return x * 0 + doubled

    @colocated.colocated_python
    def ask(x):
        try:
            refuse()
        except PermissionError as error:
            assert "says no" in str(error)
            return x + 1
        return x

    x = sharded_arange(4, client.devices())
    np.testing.assert_array_equal(np.asarray(report(x)), [2, 2, 10, 10])
    assert sorted(seen) == sorted([(workers[0].pid, 1, os.getpid()), (workers[1].pid, 5, os.getpid())])
    # The callback's exception is raised on the worker, where the function catches it.
    np.testing.assert_array_equal(np.asarray(ask(x)), np.arange(4) + 1)


def test_user_errors_on_a_worker_come_back_with_their_traceback(cluster):
    client, _ = cluster(2)

    @colocated.colocated_python
    def explode(x):
        raise ValueError("boom on the worker")

    x = sharded_arange(4, client.devices())
    with pytest.raises(colocated.ColocatedError, match="boom on the worker") as info:
        explode(x)
    assert "explode" in str(info.value.remote_traceback)


def test_a_failed_discovery_leaves_nothing_parked_on_the_workers(cluster):
    client, workers = cluster(2, devices=1)
    x = sharded_arange(2, client.devices())
    refusing = workers[1].pid

    @colocated.colocated_python
    def fails_on_one_host(x):
        if os.getpid() == refusing:
            raise ValueError("not on this host")
        return x + 1

    with pytest.raises(colocated.ColocatedError, match="not on this host"):
        fails_on_one_host(x)

    @colocated.colocated_python
    def parked(x):
        from colocated import _colocated

        return x * 0 + _colocated.parked_results()

    # The first host ran the function and parked its output: it is gone.
    np.testing.assert_array_equal(np.asarray(parked(x)), [0, 0])


def test_a_wrong_or_missing_token_is_refused_and_nothing_runs(token_file, tmp_path, monkeypatch):
    worker = Worker(token_file)
    try:
        with pytest.raises(colocated.UnauthenticatedError):
            colocated.connect([worker.address], token="wrong", default=False)
        with pytest.raises(colocated.UnauthenticatedError):
            colocated.connect([worker.address], default=False)
        client = colocated.connect([worker.address], token_file=token_file, default=False)
        assert [h.name for h in client.hosts()] == [worker.address]
        # The environment's token, as a file's, without surrounding whitespace.
        monkeypatch.setenv("COLOCATED_TOKEN", token_file.read_text())
        assert colocated.connect([worker.address], default=False).hosts()[0].name == worker.address
        # Bad token arguments are the SDK's typed errors.
        with pytest.raises(colocated.InvalidArgumentError, match="not both"):
            colocated.connect([worker.address], token="t", token_file=token_file, default=False)
        with pytest.raises(colocated.InvalidArgumentError, match="token file"):
            colocated.connect([worker.address], token_file=tmp_path / "missing", default=False)
    finally:
        worker.stop()


def test_a_killed_worker_fails_pending_calls_promptly_and_the_others_keep_working(cluster, tmp_path):
    client, workers = cluster(2)
    started = str(tmp_path / "started")
    devices = client.devices()
    on_a = sharded_arange(2, devices[:2])
    on_b = sharded_arange(2, devices[2:])

    @colocated.colocated_python
    def slow(x):
        open(started, "w").close()
        time.sleep(60)
        return x

    @colocated.colocated_python
    def add_one(x):
        return x + 1

    @colocated.colocated_python
    def also_slow(x):
        time.sleep(60)
        return x

    pending = also_slow.specialize(out_specs_fn=lambda x: x)
    result = []
    caller = threading.Thread(target=lambda: result.append(_call_and_catch(slow, on_a)))
    caller.start()
    eventually("the slow call runs", lambda: os.path.exists(started), timeout=30)
    follow_up = pending(on_a)  # still pending on that worker when it dies
    workers[0].kill()
    began = time.monotonic()
    with pytest.raises(colocated.UnavailableError):
        colocated.block_until_ready(follow_up)
    assert time.monotonic() - began < 2.0
    caller.join(timeout=5)
    assert isinstance(result[0], colocated.UnavailableError), result
    # The other host keeps working.
    np.testing.assert_array_equal(np.asarray(add_one(on_b)), [1, 2])


def test_an_upload_to_a_worker_that_stops_reading_ends_once_it_is_lost(cluster):
    client, workers = cluster(2, devices=1)
    workers[0].proc.send_signal(signal.SIGSTOP)  # hung: connected, reads nothing
    try:
        began = time.monotonic()
        # Far more than the sockets and HTTP/2 windows hold: the copy waits for
        # the network until the worker counts as lost.
        with pytest.raises(colocated.UnavailableError):
            colocated.block_until_ready(colocated.device_put(np.ones(256 << 20, np.uint8), client.devices()[0]))
        # Within the session timeout (2 s here), for which a controller
        # waits for a worker it does not hear to come back, not later.
        assert time.monotonic() - began < 2.9
    finally:
        workers[0].proc.send_signal(signal.SIGCONT)
    # The other host keeps working.
    x = colocated.device_put(np.arange(4), client.devices()[1])
    np.testing.assert_array_equal(np.asarray(x), np.arange(4))


def _call_and_catch(fn, *args):
    try:
        return fn(*args)
    except Exception as error:  # noqa: BLE001 - the test inspects it
        return error


def test_program_order_per_thread_holds_on_a_worker_and_threads_run_concurrently(cluster):
    client, _ = cluster(1)
    dev0, dev1 = client.devices()
    on = [colocated.device_put(np.full(2, i, np.int32), dev0) for i in range(30)]

    @colocated.colocated_python_class
    class Recorder:
        def __init__(self):
            self.log = []
            self.barrier = threading.Barrier(2, timeout=20)

        def record(self, x):
            self.log.append(int(np.asarray(x)[0]))
            return x

        def history(self, x):
            return colocated.device_put(np.array(self.log, np.int32), x.sharding)

        def meet(self, x):
            # Returns only once the other thread's call is inside too.
            self.barrier.wait()
            return x + 1

    rec = Recorder()
    rec.record(on[0])  # discovers the output spec
    rec.record = rec.record.specialize(out_specs_fn=lambda x: x)
    for x in on[1:]:
        rec.record(x)  # asynchronous: queued in order
    np.testing.assert_array_equal(np.asarray(rec.history(on[0])), np.arange(30))

    x_a = colocated.device_put(np.zeros(2, np.int32), dev0)
    x_b = colocated.device_put(np.zeros(2, np.int32), dev1)
    results = []
    threads = [threading.Thread(target=lambda x=x: results.append(_call_and_catch(rec.meet, x))) for x in (x_a, x_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 2
    for r in results:
        assert isinstance(r, colocated.Array), r
        np.testing.assert_array_equal(np.asarray(r), [1, 1])


def test_arrays_copy_between_hosts_with_progress(cluster, capsys, monkeypatch):
    client, _ = cluster(2, devices=1)
    on_a, on_b = client.devices()
    n = 3 << 20  # 12 MiB: several chunks
    x = colocated.device_put(np.arange(n, dtype=np.int32), on_a)
    reports = []
    y = colocated.device_put(x, on_b, progress=lambda done, total: reports.append((done, total)))
    assert y.sharding == colocated.SingleDeviceSharding(on_b)
    np.testing.assert_array_equal(np.asarray(y), np.arange(n))
    assert reports[-1] == (x.nbytes, x.nbytes)
    assert all(a[0] <= b[0] for a, b in itertools.pairwise(reports))
    # With progress=True, a tqdm bar.
    z = colocated.device_put(y, on_a, progress=True)
    np.testing.assert_array_equal(np.asarray(z), np.arange(n))
    assert "device_put" in capsys.readouterr().err
    with pytest.raises(colocated.InvalidArgumentError, match="progress"):
        colocated.device_put(x, on_b, progress="yes")
    # progress=False is no progress.
    np.testing.assert_array_equal(np.asarray(colocated.device_put(x, on_b, progress=False)), np.arange(n))
    assert "device_put" not in capsys.readouterr().err
    # Without tqdm, a bar is a typed error that says what to install.
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.raises(colocated.FailedPreconditionError, match="colocated\\[progress\\]"):
        colocated.device_put(x, on_b, progress=True)


def test_reconnecting_to_a_restarted_worker_works(token_file):
    previous = _client._current_default()
    worker = Worker(token_file)
    try:
        client = colocated.connect([worker.address], token_file=token_file)
        x = sharded_arange(4, client.devices())
        worker.kill()
        eventually("reads fail with unavailable", lambda: _raises_unavailable(lambda: np.asarray(x)), timeout=5)
        worker.stop()
        worker = Worker(token_file, listen=worker.address)
        client = colocated.connect([worker.address], token_file=token_file)
        y = sharded_arange(4, client.devices())

        @colocated.colocated_python
        def add_one(y):
            return y + 1

        np.testing.assert_array_equal(np.asarray(add_one(y)), [1, 2, 3, 4])
    finally:
        _client._set_default(previous)
        gc.collect()
        worker.stop()


def _raises_unavailable(fn) -> bool:
    try:
        fn()
    except colocated.UnavailableError:
        return True
    return False


def test_a_call_over_the_controllers_host_and_a_worker_runs_on_both(token_file):
    previous = _client._current_default()
    worker = Worker(token_file)
    try:
        client = colocated.connect([worker.address], token_file=token_file, include_local=True, num_cpu_devices=2)
        assert [d.process_index for d in client.devices()] == [0, 0, 1, 1]
        x = sharded_arange(8, client.devices())

        @colocated.colocated_python
        def where(x):
            assert x.shape == (4,), x.shape
            return x * 0 + os.getpid()

        @colocated.colocated_python
        def add_one(x):
            return x + 1

        np.testing.assert_array_equal(np.asarray(add_one(x)), np.arange(8) + 1)
        np.testing.assert_array_equal(np.asarray(add_one(add_one(x))), np.arange(8) + 2)
        assert np.asarray(where(x)).tolist() == [os.getpid()] * 4 + [worker.pid] * 4
    finally:
        _client._set_default(previous)
        gc.collect()
        worker.stop()


def test_a_client_that_is_not_the_default_keeps_its_own_devices(token_file):
    previous = _client._current_default()
    worker = Worker(token_file, devices=3)
    try:
        client = colocated.connect([worker.address], token_file=token_file, default=False)
        assert _client._current_default() is previous
        x = sharded_arange(6, client.devices())
        # The array's sharding names the worker's devices, not the default client's.
        assert x.sharding.mesh.devices.tolist() == client.devices()
        assert {d.process_index for d in x.sharding.device_set} == {1}

        @colocated.colocated_python
        def add_one(x):
            return x + 1

        y = add_one(x)
        assert y.sharding == x.sharding
        np.testing.assert_array_equal(np.asarray(y), np.arange(6) + 1)
    finally:
        _client._set_default(previous)
        gc.collect()
        worker.stop()
