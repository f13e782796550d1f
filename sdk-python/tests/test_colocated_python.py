"""colocated_python: functions run on the hosts of their inputs' devices.

The scenarios of the JAX colocated Python documentation and of JAX's own test
suite (tests/colocated_python_test.py) that do not need JAX, re-expressed for
colocated; then what we do beyond JAX (the in_specs check, cache counts); then
bad input. Classes are in test_colocated_class.py.

Host code shares state with the test through a module registered in
``sys.modules`` (the ``state`` fixture): cloudpickle sends modules by name, so
the host sees the same module object, as JAX's tests use attributes of an
imported module. Every wait is bounded: barriers and gates have timeouts, and
waits that could hang run on a helper thread (``wait_bounded``).
"""

import base64
import collections
import concurrent.futures
import gc
import struct
import tempfile
import threading
import time
import weakref

import numpy as np
import optree
import pytest
from colocated_helpers import GATE_WAIT, WAIT, cpu, error_text, outcome, put, wait_bounded

import colocated
from colocated import Mesh, NamedSharding, P, ShapeDtypeStruct, SingleDeviceSharding, _colocated, _colocated_python

STRING = np.dtypes.StringDType()

Pair = collections.namedtuple("Pair", ["left", "right"])

def add_one_to_leaves(tree):
    return optree.tree_map(lambda v: v + 1, tree)


def counts(fn):
    info = fn.cache_info()
    return info.hits, info.misses, info.currsize


# -- devices -----------------------------------------------------------------------


def test_colocated_cpu_devices_maps_devices_and_meshes():
    devices = colocated.devices()[:1]
    cpu_devices = list(colocated.colocated_cpu_devices(devices))
    # On a CPU host the colocated CPU devices are the devices themselves.
    assert cpu_devices == list(devices)
    mesh = Mesh(np.array(devices).reshape((1, 1)), ("x", "y"))
    assert colocated.colocated_cpu_devices(mesh) == Mesh(np.array(cpu_devices).reshape((1, 1)), ("x", "y"))


# -- simple functions ----------------------------------------------------------------


def test_docs_example_simple_function_keeps_sharding():
    cpu_devices = cpu(1)
    cpu_mesh = Mesh(cpu_devices, ("x",))
    cpu_sharding = NamedSharding(cpu_mesh, P())
    x = colocated.device_put(np.int32(1), cpu_sharding)

    def f(x):
        return x + 1

    f = colocated.colocated_python(f)
    y = f(x)
    assert y.sharding == x.sharding
    assert y.shape == () and y.dtype == np.int32
    assert int(y) == 2


def test_simple_function_hits_the_cache_on_the_second_call():
    @colocated.colocated_python
    def add_one(x):
        return x + 1

    x = put(1)
    assert int(add_one(x)) == 2
    assert add_one.cache_info().misses == 1
    assert int(add_one(x)) == 2
    assert counts(add_one) == (1, 1, 1)


def test_docs_example_io_is_done_once_outputs_are_ready(tmp_path):
    path = str(tmp_path / "foo")
    x = colocated.device_put(np.int32(1), NamedSharding(Mesh(cpu(1), ("x",)), P()))

    def f(x):
        with open(path, "w") as out:
            out.write(str(int(np.asarray(x))))
        return x

    f = colocated.colocated_python(f)
    y = colocated.block_until_ready(f(x))
    assert int(y) == 1 and y.sharding == x.sharding
    with open(path) as written:
        assert written.read() == "1"


def test_function_over_a_sharded_array_keeps_its_sharding():
    mesh = Mesh(cpu(4), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    x = colocated.device_put(np.arange(8, dtype=np.float32), sharding)

    @colocated.colocated_python
    def twice(x):
        return x * 2

    y = twice(x)
    assert y.sharding == sharding
    np.testing.assert_array_equal(np.asarray(y), np.arange(8, dtype=np.float32) * 2)
    assert [s.device for s in y.addressable_shards] == list(mesh.devices.flat)


# -- pytrees ---------------------------------------------------------------------------


def test_pytrees_in_and_out():
    x = colocated.device_put(
        [np.int32(1), (np.int32(2), {"v": np.int32(3)})], SingleDeviceSharding(cpu(1)[0])
    )
    add_one = colocated.colocated_python(add_one_to_leaves)
    for _ in range(2):
        out = add_one(x)
        assert isinstance(out, list) and isinstance(out[1], tuple) and isinstance(out[1][1], dict)
        assert optree.tree_map(lambda v: int(v), out) == [2, (3, {"v": 4})]
    assert add_one.cache_info().misses == 1


def test_pytrees_with_none_kwargs_and_namedtuples():
    d0 = cpu(1)[0]
    tree = {
        "a": np.int32(1),
        "b": [np.float32(2.5), (np.int32(3), {"v": np.arange(4, dtype=np.int32)})],
        "none": None,
    }
    x = colocated.device_put(tree, SingleDeviceSharding(d0))
    assert x["none"] is None
    offset = put(10)

    @colocated.colocated_python
    def rearrange(tree, *, offset):
        assert tree["none"] is None
        return Pair(
            left=(tree["a"] + offset, None),
            right=[tree["b"][1][1]["v"] * 2, {"half": tree["b"][0] / 2}],
        )

    out = rearrange(x, offset=offset)
    assert type(out) is Pair
    assert out.left[1] is None
    assert int(out.left[0]) == 11
    np.testing.assert_array_equal(np.asarray(out.right[0]), np.arange(4, dtype=np.int32) * 2)
    assert out.right[0].dtype == np.int32
    assert out.right[1]["half"].dtype == np.float32
    assert float(out.right[1]["half"]) == 1.25
    for leaf in optree.tree_leaves(out):
        assert leaf.sharding.device_set == {d0}


def test_function_returning_only_none_with_devices():
    @colocated.colocated_python
    def nothing():
        return None

    assert nothing.specialize(devices=cpu(1))() is None


# -- calls without array inputs --------------------------------------------------------


def test_zero_argument_call_without_devices_is_an_error():
    sharding = SingleDeviceSharding(cpu(1)[0])

    @colocated.colocated_python
    def make_zero():
        return colocated.device_put(np.int32(0), sharding)

    with pytest.raises(ValueError, match="devices") as info:
        make_zero()
    assert isinstance(info.value, colocated.InvalidArgumentError)


def test_zero_argument_call_with_devices_specialization():
    d0 = cpu(1)[0]
    sharding = SingleDeviceSharding(d0)

    @colocated.colocated_python
    def make_zero():
        return colocated.device_put(np.int32(0), sharding)

    make_zero = make_zero.specialize(devices=[d0])
    for _ in range(2):
        out = make_zero()
        assert int(out) == 0
        assert out.sharding.device_set == {d0}
    assert make_zero.cache_info().misses == 1


def test_docs_example_zero_argument_function_with_devices(tmp_path):
    path = str(tmp_path / "foo")

    def f():
        with open(path, "w") as out:
            out.write("foo")

    f = colocated.colocated_python(f)
    f = f.specialize(devices=colocated.colocated_cpu_devices(colocated.devices()[:1]))
    assert f() is None
    # Without outputs to wait on, the call returns once the function has run.
    with open(path) as written:
        assert written.read() == "foo"


# -- specialization --------------------------------------------------------------------


def test_docs_example_out_specs_fn_specialization():
    x = colocated.device_put(np.int32(1), NamedSharding(Mesh(cpu(1), ("x",)), P()))

    def f(x):
        return x + 1

    f = colocated.colocated_python(f)
    f = f.specialize(out_specs_fn=lambda x: x)
    y = f(x)
    assert y.sharding == x.sharding
    assert int(y) == 2


def test_out_specs_fn_makes_every_call_asynchronous(state):
    state.gate = threading.Event()
    state.finished = []

    def gated_add_one(x):
        opened = state.gate.wait(GATE_WAIT)
        state.finished.append(opened)
        return x + 1

    f = colocated.colocated_python(gated_add_one).specialize(out_specs_fn=lambda x: x)
    x = put(1)
    ys = [f(x), f(x)]  # returns before the function can finish
    assert state.finished == []
    assert not any(y.is_ready() for y in ys)
    assert all(y.sharding == x.sharding and y.shape == () and y.dtype == np.int32 for y in ys)
    state.gate.set()
    assert [int(y) for y in wait_bounded(ys)] == [2, 2]
    assert state.finished == [True, True]


def test_compile_ahead_gives_a_serializable_program_that_later_calls_take(state):
    state.runs = 0

    def add_one(x):
        state.runs += 1
        return x + 1

    x = put(41)
    spec = ShapeDtypeStruct(x.shape, x.dtype, x.sharding)
    with pytest.raises(colocated.InvalidArgumentError, match="needs its output specs declared"):
        colocated.colocated_python(add_one).compile(spec)
    f = colocated.colocated_python(add_one).specialize(out_specs_fn=lambda x: x)
    with pytest.raises(colocated.InvalidArgumentError, match="leaf 0 is a int"):
        f.compile(3)
    exe = f.compile(spec)
    assert state.runs == 0  # compiled, not run
    # The portable bytes of a `python` program (what another SDK loads).
    data = exe.serialize()
    assert b"python" in data and len(data) > 100
    outputs, status = exe.execute([x._impl])
    status.wait()
    assert int(colocated._array._wrap(outputs[0], x.sharding)) == 42
    # A call of that spec takes the program compiled ahead.
    before = counts(f)
    assert int(wait_bounded(f(x))) == 42
    assert counts(f)[0] == before[0] + 1
    assert state.runs == 2


def test_first_call_is_synchronous_then_calls_are_asynchronous(state):
    state.gate = threading.Event()
    state.gate.set()
    state.runs = 0

    def gated_add_one(x):
        opened = state.gate.wait(GATE_WAIT)
        state.runs += 1
        return x + (1 if opened else 100)

    f = colocated.colocated_python(gated_add_one)
    x = put(1)
    first = f(x)
    assert state.runs == 1  # ran once to discover the output specs
    assert int(wait_bounded(first)) == 2

    state.gate.clear()
    second = f(x)
    assert state.runs == 1 and not second.is_ready()
    state.gate.set()
    assert int(wait_bounded(second)) == 2
    assert state.runs == 2


def test_docs_example_in_specs_specialization():
    cpu_sharding = NamedSharding(Mesh(cpu(1), ("x",)), P())
    x = colocated.device_put(np.int32(1), cpu_sharding)

    def f(x):
        return x + 1

    f = colocated.colocated_python(f)
    f = f.specialize(
        in_specs=((ShapeDtypeStruct(shape=(), dtype=np.int32, sharding=cpu_sharding),), {}),
        out_specs_fn=lambda x: ShapeDtypeStruct(shape=(), dtype=np.int32, sharding=cpu_sharding),
    )
    for _ in range(3):
        y = f(x)
        assert y.sharding == x.sharding and y.dtype == np.int32
        assert int(y) == 2


def test_a_host_error_keeps_the_runtimes_code_and_no_other():
    class Coded(Exception):
        code = "not_found"

    def raising(kind):
        def fn(x):
            raise kind("no such thing")

        return colocated.colocated_python(fn)

    for kind, code in [(colocated.NotFoundError, "not_found"), (Coded, "internal")]:
        with pytest.raises(colocated.RemoteError, match="no such thing") as err:
            colocated.block_until_ready(raising(kind)(put(1)))
        assert err.value.code == code, kind


def test_a_first_call_on_the_local_host_keeps_no_result_alive():
    # The compiled program runs the function object the first call ran: it
    # must not hold what that call returned.
    made = []

    @colocated.colocated_python
    def fresh(x):
        y = x + 1
        made.append(weakref.ref(y))
        return y

    out = fresh(put(1))
    assert int(wait_bounded(out)) == 2
    del out
    gc.collect()
    assert made[0]() is None, "the first call's result outlived its caller's reference"


def test_a_tree_of_in_specs_keeps_matching_calls_after_many_other_structures():
    # The key of a specialization's structure stays its key: calls whose
    # trees have data-dependent keys, many of them, never make a matching
    # call another structure.
    from colocated import _colocated_python as cp

    d0 = cpu(1)[0]
    spec = ShapeDtypeStruct(shape=(), dtype=np.int32, sharding=SingleDeviceSharding(d0))

    @colocated.colocated_python
    def a_plus_one(tree):
        return tree["a"] + 1

    f = a_plus_one.specialize(in_specs=(({"a": spec},), {}), out_specs_fn=lambda tree: tree["a"])
    for i in range(5000):
        cp._tree_key(cp._flatten(({f"k{i}": 0},))[1])
    assert int(wait_bounded(f({"a": put(1)}))) == 2


def test_in_specs_mismatch_is_an_error():
    d0, d1 = cpu(2)
    sharding = SingleDeviceSharding(d0)
    spec = ShapeDtypeStruct(shape=(), dtype=np.int32, sharding=sharding)

    @colocated.colocated_python
    def add_one(*args):
        return args[0] + 1

    f = add_one.specialize(in_specs=((spec,), {}), out_specs_fn=lambda x: x)
    assert int(f(put(1))) == 2
    for name, args in [
        ("dtype", (put(1, dtype=np.float32),)),
        ("shape", (put([1, 2]),)),
        ("structure", (put(1), put(2))),
    ]:
        with pytest.raises(colocated.InvalidArgumentError, match="in_specs") as info:
            colocated.block_until_ready(f(*args))
        assert isinstance(info.value, ValueError), name
    with pytest.raises(colocated.InvalidArgumentError):
        colocated.block_until_ready(f(put(1, target=d1)))
    # The specialized function still works after rejecting calls.
    assert int(f(put(41))) == 42


def test_specializing_a_field_twice_is_an_error():
    d0 = cpu(1)[0]
    spec = ShapeDtypeStruct((), np.int32, sharding=SingleDeviceSharding(d0))

    @colocated.colocated_python
    def add_one(x):
        return x + 1

    cases = {
        "devices": {"devices": [d0]},
        "out_specs_fn": {"out_specs_fn": lambda x: x},
        "in_specs": {"in_specs": ((spec,), {})},
    }
    for field, kwargs in cases.items():
        once = add_one.specialize(**kwargs)
        with pytest.raises(ValueError, match=field):
            once.specialize(**kwargs)
    # Different fields may be specialized one after the other.
    f = add_one.specialize(devices=[d0]).specialize(out_specs_fn=lambda x: x).specialize(in_specs=((spec,), {}))
    assert int(f(put(1))) == 2


# -- input polymorphism ----------------------------------------------------------------


def _exercise_polymorphism(add_one):
    d0, d1 = cpu(2)
    x = put(1, d0)
    assert int(add_one(x)) == 2
    assert counts(add_one) == (0, 1, 1)
    assert int(add_one(x)) == 2
    # Equal specs: a new array, and a new but equal sharding object.
    assert int(add_one(put(5, d0))) == 6
    assert int(add_one(put(7, SingleDeviceSharding(d0)))) == 8
    assert counts(add_one) == (3, 1, 1)

    new_specs = [
        put([1, 2], d0),  # shape
        put(1, d0, dtype=np.float32),  # dtype
        put(1, d1),  # sharding
        colocated.device_put([np.int32(1), (np.int32(2), {"v": np.int32(3)})], SingleDeviceSharding(d0)),  # tree
    ]
    for k, arg in enumerate(new_specs):
        for _ in range(2):
            out = add_one(arg)
            assert optree.tree_map(lambda v: np.asarray(v).tolist(), out) == optree.tree_map(
                lambda v: (np.asarray(v) + 1).tolist(), arg
            )
        assert counts(add_one) == (3 + k + 1, 1 + k + 1, 1 + k + 1)


def test_input_polymorphism_counts_cache_hits_and_misses():
    _exercise_polymorphism(colocated.colocated_python(add_one_to_leaves))


def test_input_polymorphism_with_out_specs_fn():
    f = colocated.colocated_python(add_one_to_leaves).specialize(out_specs_fn=lambda x: x)
    _exercise_polymorphism(f)


def test_clear_caches_works_every_time():
    @colocated.colocated_python
    def add_one(x):
        return x + 1

    x = put(1)
    for round_ in range(3):
        assert int(add_one(x)) == 2
        assert int(add_one(x)) == 2
        assert add_one.cache_info().currsize == 1, round_
        colocated.clear_caches()
        assert add_one.cache_info().currsize == 0, round_
        misses = add_one.cache_info().misses  # whether or not clearing resets the counts
        assert int(add_one(x)) == 2  # compiled again: a miss
        assert add_one.cache_info().misses == misses + 1, round_
        assert add_one.cache_info().currsize == 1, round_


# -- execution order and concurrency ---------------------------------------------------


@pytest.mark.parametrize("on_main_thread", [True, False], ids=["main_thread", "other_thread"])
def test_program_order_within_a_thread(state, on_main_thread):
    state.log = []

    def record(x):
        state.log.append(int(np.asarray(x)))
        return x

    record = colocated.colocated_python(record).specialize(out_specs_fn=lambda x: x)
    xs = [put(i) for i in range(50)]
    seen = {}

    def calls():
        outs = [record(x) for x in xs]  # no wait in between
        colocated.block_until_ready(outs[-1])  # waiting for the last call only
        seen["log"] = list(state.log)

    if on_main_thread:
        calls()
    else:
        t = threading.Thread(target=calls, daemon=True)
        t.start()
        t.join(3 * WAIT)
        assert not t.is_alive()
    assert seen["log"] == list(range(50))


def test_program_order_earlier_side_effects_are_visible(state):
    x = put(1)

    def set_100(x):
        state.value = 100
        return x

    def increment(x):
        assert state.value == 100
        state.value += 1
        return x

    def expect_101(x):
        assert state.value == 101
        return x + 1

    set_100, increment, expect_101 = (
        colocated.colocated_python(fn).specialize(out_specs_fn=lambda x: x) for fn in (set_100, increment, expect_101)
    )
    set_100(x)
    increment(x)
    assert int(wait_bounded(expect_101(x))) == 2
    assert state.value == 101


def _barrier_functions(state, parties):
    def init(x):
        state.barrier = threading.Barrier(parties)
        return x

    def meet(x):
        state.barrier.wait(timeout=WAIT)
        return x + 1

    init = colocated.colocated_python(init)
    # With out_specs_fn every call is asynchronous.
    meet = colocated.colocated_python(meet).specialize(out_specs_fn=lambda x: x)
    return init, meet


def _run_threads(targets):
    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 3 * WAIT
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "threads did not finish"


def test_calls_from_different_threads_run_concurrently(state):
    x = put(1)
    init, meet = _barrier_functions(state, 3)
    colocated.block_until_ready(init(x))
    outs = [None] * 3
    errors = []

    def caller(i):
        def run():
            try:
                outs[i] = meet(x)  # no wait: the calls run while nobody waits
            except Exception as err:  # noqa: BLE001
                errors.append(err)

        return run

    _run_threads([caller(i) for i in range(3)])
    assert errors == []
    # Succeeds only if the three calls were inside the barrier at the same time.
    assert [int(y) for y in wait_bounded(outs)] == [2, 2, 2]


def test_threads_waiting_on_their_own_calls_run_concurrently(state):
    x = put(1)
    init, meet = _barrier_functions(state, 3)
    colocated.block_until_ready(init(x))
    results = []
    errors = []

    def run():
        try:
            results.append(int(colocated.block_until_ready(meet(x))))
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    _run_threads([run] * 3)
    assert errors == []
    assert results == [2, 2, 2]


def test_docs_example_thread_pool_calls_run_concurrently(state):
    x = colocated.device_put(np.int32(1), NamedSharding(Mesh(cpu(1), ("x",)), P()))
    state.barrier = threading.Barrier(2)

    def f(x):
        state.barrier.wait(timeout=WAIT)  # the docs sleep 1s; a barrier proves overlap
        return x + 1

    f = colocated.colocated_python(f)
    f = f.specialize(out_specs_fn=lambda x: x)  # Calls will be asynchronous.
    # A call returns at once, so one pool thread could make both calls (one after
    # the other, in program order); a caller-side barrier puts them on two threads.
    callers = threading.Barrier(2)

    def call(x):
        callers.wait(timeout=WAIT)
        return f(x)

    with concurrent.futures.ThreadPoolExecutor(2) as executor:
        fut1 = executor.submit(call, x)
        fut2 = executor.submit(call, x)
        outs = wait_bounded([fut1.result(timeout=3 * WAIT), fut2.result(timeout=3 * WAIT)])
    assert [int(y) for y in outs] == [2, 2]


# -- devices and shardings -------------------------------------------------------------


def test_inputs_with_different_device_orders():
    d0, d1 = cpu(2)

    @colocated.colocated_python
    def add(x, y):
        # x's shards are on (d0, d1) and y's on (d1, d0): pair them by device.
        on_d1 = x.addressable_shards[1].data + y.addressable_shards[0].data
        on_d0 = x.addressable_shards[0].data + y.addressable_shards[1].data
        return colocated.make_array_from_single_device_arrays(y.shape, y.sharding, [on_d1, on_d0])

    # Mixed device orders: specialize with devices rather than inferring them.
    add = add.specialize(devices=[d0, d1])
    sharding1 = NamedSharding(Mesh([d0, d1], ("x",)), P("x"))
    sharding2 = NamedSharding(Mesh([d1, d0], ("x",)), P("x"))
    x = colocated.device_put(np.array([0, 2], np.int32), sharding1)
    y = colocated.device_put(np.array([4, 8], np.int32), sharding2)

    out = add(x, y)
    assert out.sharding == sharding2
    assert [s.device for s in out.addressable_shards] == [d1, d0]
    np.testing.assert_array_equal(np.asarray(out), np.array([2 + 4, 0 + 8]))


def test_function_closing_over_a_sharding():
    d0, d1 = cpu(2)
    mesh = Mesh([d0, d1], ("x",))
    replicated = NamedSharding(mesh, P())
    split = NamedSharding(mesh, P("x"))

    @colocated.colocated_python
    def spread(x):
        value = np.asarray(x)
        return colocated.device_put(np.stack([value, value + 1]).ravel(), split)

    x = colocated.device_put(np.array([5], np.int32), replicated)
    out = spread(x)
    assert out.sharding == split
    np.testing.assert_array_equal(np.asarray(out), np.array([5, 6], np.int32))
    assert [np.asarray(s.data).tolist() for s in out.addressable_shards] == [[5], [6]]


def test_function_closing_over_a_device():
    # Beyond JAX (whose serializer cannot pickle a bare device): devices travel by id.
    d1 = cpu(2)[1]

    @colocated.colocated_python
    def double_on(x):
        return colocated.device_put(np.asarray(x) * 2, d1)

    out = double_on(put(4, d1))
    assert out.sharding.device_set == {d1}
    assert int(out) == 8


# -- state on the host -----------------------------------------------------------------


def test_module_state_is_visible_across_calls(state):
    # An object that cannot be pickled: sending the module by value would fail.
    state.unpicklable = tempfile.TemporaryFile()  # noqa: SIM115 - closed in `finally`
    try:

        @colocated.colocated_python
        def set_state(x):
            state.saved = x
            return x + 1

        @colocated.colocated_python
        def get_state(y):
            del y
            return state.saved

        x = put(1)
        y = put(2)
        assert int(colocated.block_until_ready(set_state(x))) == 2
        assert int(get_state(y)) == 1
    finally:
        state.unpicklable.close()


# -- strings and binary data -----------------------------------------------------------


def test_string_arrays_in_and_out():
    mesh = Mesh(np.array(cpu(2)).reshape((2, 1)), ("x", "y"))
    sharding = NamedSharding(mesh, P("x"))
    x = colocated.device_put(np.array([["abcd", "efgh"], ["ijkl", "mnop"]], dtype=STRING), sharding)

    @colocated.colocated_python
    def upper(x):
        to_upper = np.vectorize(lambda s: s.upper(), otypes=[STRING])
        shards = [colocated.device_put(to_upper(np.asarray(s.data)), s.device) for s in x.addressable_shards]
        return colocated.make_array_from_single_device_arrays(x.shape, x.sharding, shards)

    out = upper(x)
    assert out.sharding == sharding
    back = np.asarray(out)
    assert back.dtype == STRING
    assert back.tolist() == [["ABCD", "EFGH"], ["IJKL", "MNOP"]]


def test_binary_data_as_base64_strings():
    def pack(a, b):
        return base64.b64encode(struct.pack("<ii", a, b)).decode("ascii")

    @colocated.colocated_python
    def increment_packed(x):
        shards = []
        for shard in x.addressable_shards:
            a, b = struct.unpack("<ii", base64.b64decode(str(np.asarray(shard.data)[0]).encode("ascii")))
            packed = base64.b64encode(struct.pack("<ii", a + 1, b + 1)).decode("ascii")
            shards.append(colocated.device_put(np.array([packed], dtype=STRING), shard.device))
        return colocated.make_array_from_single_device_arrays(x.shape, x.sharding, shards)

    x = colocated.device_put(np.array([pack(1001, 1002)], dtype=STRING), SingleDeviceSharding(cpu(1)[0]))
    out = np.asarray(increment_packed(x))
    assert struct.unpack("<ii", base64.b64decode(str(out[0]).encode("ascii"))) == (1002, 1003)


def test_bytes_are_not_arrays():
    @colocated.colocated_python
    def identity(x):
        return x

    with pytest.raises(colocated.InvalidArgumentError, match="bytes"):
        identity(b"\x00\x01binary")
    with pytest.raises(colocated.InvalidArgumentError, match="bytes"):
        identity([put(1), b"\x00"])


# -- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [1, 2.5, b"raw", object()], ids=["int", "float", "bytes", "object"]
)
def test_non_array_inputs_are_rejected(value):
    @colocated.colocated_python
    def identity(*args):
        return args[0]

    with pytest.raises(colocated.InvalidArgumentError, match=type(value).__name__) as info:
        identity(value)
    assert isinstance(info.value, ValueError)
    with pytest.raises(colocated.InvalidArgumentError, match=type(value).__name__):
        identity(put(1), {"k": value})
    # The same wrapper still works with arrays.
    assert int(identity(put(3))) == 3


def test_inputs_on_different_device_lists_are_rejected():
    d0, d1 = cpu(2)

    @colocated.colocated_python
    def add(x, y):
        return x + y

    with pytest.raises(colocated.InvalidArgumentError) as info:
        add(put(1, d0), put(2, d1))
    assert isinstance(info.value, ValueError)
    both = colocated.device_put(np.int32(2), NamedSharding(Mesh([d0, d1], ("x",)), P()))
    with pytest.raises(colocated.InvalidArgumentError):
        add(put(1, d0), both)
    assert int(add(put(1, d0), put(2, d0))) == 3


def test_outputs_on_other_devices_are_rejected():
    d0, d1 = cpu(2)

    elsewhere = SingleDeviceSharding(d1)

    @colocated.colocated_python
    def move(x):
        return colocated.device_put(np.asarray(x), elsewhere)

    err = outcome(lambda: move(put(1, d0)))
    assert isinstance(err, colocated.InvalidArgumentError), repr(err)


def test_out_specs_on_other_devices_are_rejected():
    d0, d1 = cpu(2)

    @colocated.colocated_python
    def identity(x):
        return x

    elsewhere = SingleDeviceSharding(d1)
    f = identity.specialize(out_specs_fn=lambda x: ShapeDtypeStruct(x.shape, x.dtype, sharding=elsewhere))
    err = outcome(lambda: f(put(1, d0)))
    assert isinstance(err, colocated.InvalidArgumentError), repr(err)


@pytest.mark.parametrize("value", [b"raw", 7], ids=["bytes", "int"])
def test_non_array_outputs_are_rejected(value):
    @colocated.colocated_python
    def leak(x):
        return [x, value]

    err = outcome(lambda: leak(put(1)))
    assert isinstance(err, (colocated.InvalidArgumentError, colocated.RemoteError)), repr(err)
    assert type(value).__name__ in error_text(err)


def test_outputs_not_matching_out_specs_fn_are_an_error():
    @colocated.colocated_python
    def grow(x):
        return colocated.device_put(np.zeros(3, np.int32), x.sharding)

    f = grow.specialize(out_specs_fn=lambda x: x)  # promises a scalar
    err = outcome(lambda: f(put(1)))
    assert isinstance(err, (colocated.ColocatedError, ValueError)), repr(err)


def test_user_exception_surfaces_with_its_traceback():
    @colocated.colocated_python
    def explode_on_the_host(x):
        if int(np.asarray(x)) < 0:
            raise ZeroDivisionError("boom from the host")
        return x

    for f in (explode_on_the_host, explode_on_the_host.specialize(out_specs_fn=lambda x: x)):
        err = outcome(lambda f=f: f(put(-1)))
        assert isinstance(err, (colocated.ColocatedError, ZeroDivisionError)), repr(err)
        text = error_text(err)
        assert "explode_on_the_host" in text
        assert "boom from the host" in text
        # The function keeps working after a failed call.
        assert int(wait_bounded(f(put(3)))) == 3


def test_failed_asynchronous_call_does_not_break_later_calls(state):
    state.log = []

    def record_or_fail(x):
        value = int(np.asarray(x))
        if value == 2:
            raise RuntimeError("refusing 2")
        state.log.append(value)
        return x

    f = colocated.colocated_python(record_or_fail).specialize(out_specs_fn=lambda x: x)
    outs = [f(put(i)) for i in range(5)]
    err = outcome(lambda: outs[2])
    assert err is not None and "refusing 2" in error_text(err)
    assert [int(y) for y in wait_bounded([outs[k] for k in (0, 1, 3, 4)])] == [0, 1, 3, 4]
    assert state.log == [0, 1, 3, 4]


def test_flat_calls_check_what_the_function_returns_every_time(state):
    # Positional-array calls of a compiled program take the native fast path,
    # which must check the result as the general path does.
    state.mode = "array"

    def shifty(x):
        if state.mode == "tuple":
            return (x, x)
        if state.mode == "numpy":
            return np.asarray(x)
        return x

    f = colocated.colocated_python(shifty).specialize(out_specs_fn=lambda x: x)
    assert int(wait_bounded(f(put(1)))) == 1
    state.mode = "tuple"
    err = outcome(lambda: f(put(2)))
    assert isinstance(err, colocated.ColocatedError), repr(err)
    assert "another structure than its program's" in error_text(err)
    state.mode = "numpy"
    err = outcome(lambda: f(put(3)))
    assert isinstance(err, colocated.ColocatedError), repr(err)
    assert "ndarray" in error_text(err)
    state.mode = "array"
    assert int(wait_bounded(f(put(4)))) == 4


def test_positional_keyword_and_pytree_calls_are_separate_cache_entries():
    @colocated.colocated_python
    def add(x, y=None):
        return x if y is None else x + y

    a, b = put(1), put(2)
    assert int(wait_bounded(add(a, b))) == 3
    assert int(wait_bounded(add(a, y=b))) == 3
    assert int(wait_bounded(add(a))) == 1
    for _ in range(3):
        assert int(wait_bounded(add(a, b))) == 3
        assert int(wait_bounded(add(a, y=b))) == 3
    info = add.cache_info()
    assert (info.hits, info.misses, info.currsize) == (6, 3, 3)


def test_a_cached_flat_call_still_checks_the_device_rules():
    d0, d1 = cpu(2)

    @colocated.colocated_python
    def add(x, y):
        return x + y

    assert int(wait_bounded(add(put(1, d0), put(2, d0)))) == 3
    err = outcome(lambda: add(put(1, d0), put(2, d1)))
    assert isinstance(err, colocated.InvalidArgumentError), repr(err)
    assert "different device lists" in error_text(err)



def test_structures_whose_hashes_collide_get_programs_of_their_own():
    # hash(-1) == hash(-2) in Python: two structures with one hash.
    seen = []

    @colocated.colocated_python
    def keys(tree):
        seen.append(sorted(tree))
        return next(iter(tree.values()))

    x = put(1)
    keys({-1: x})
    keys({-2: x})
    assert seen == [[-1], [-2]]
    assert keys.cache_info().misses == 2


def test_an_output_keeps_the_sharding_object_the_function_made():
    d = colocated.devices()
    mesh = Mesh(d[:2], ("x",), (colocated.AxisType.Explicit,))
    made = NamedSharding(mesh, P("x"), memory_kind="pinned_host")
    one = NamedSharding(Mesh(d[:1], ("y",)), P())

    @colocated.colocated_python
    def remake(x):
        return colocated.device_put(np.asarray(x), made)

    @colocated.colocated_python
    def on_one(x):
        return colocated.device_put(np.asarray(x), one)

    x = colocated.device_put(np.arange(2, dtype=np.int32), NamedSharding(Mesh(d[:2], ("x",)), P("x")))
    y = colocated.device_put(np.int32(3), d[0])
    for _ in range(2):  # discovery, then the compiled program
        a = remake(x)
        assert a.sharding == made and a.sharding.memory_kind == "pinned_host"
        assert a.sharding.mesh.axis_types == (colocated.AxisType.Explicit,)
        b = on_one(y)
        assert isinstance(b.sharding, NamedSharding) and b.sharding == one
    assert remake.cache_info().hits == 1


def test_an_output_structure_need_not_pickle_on_the_local_host():
    lock = threading.Lock()  # cannot be pickled

    @colocated.colocated_python
    def keyed(x):
        return {lock: x}

    out = keyed(put(5))
    assert int(out[lock]) == 5


# -- the controller's own callables, run by reference ---------------------------------


def test_callables_run_by_reference_leave_cores_registry_with_their_function():
    # The local host runs the very callable through core's registry of local
    # values (the SDK keeps no table of its own), and the registry lets go of
    # it when the function and its compiled programs are gone.
    assert not hasattr(_colocated_python, "_LOCAL_PROGRAMS")
    gc.collect()
    before = _colocated.local_values()
    x = put(1)
    functions = []
    for i in range(20):
        functions.append(colocated.colocated_python(lambda x, i=i: x + i))
        assert int(functions[-1](x)) == 1 + i
        assert int(functions[-1](x)) == 1 + i
    # Each function's compiled program keeps its callable.
    assert _colocated.local_values() >= before + 20
    del functions
    colocated.clear_caches()
    gc.collect()
    deadline = time.monotonic() + WAIT
    while _colocated.local_values() > before and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert _colocated.local_values() == before


def test_a_call_keeps_its_callable_after_the_function_is_gone():
    # The loaded program holds the registration: a call that still runs does
    # not lose its callable when the function that made it goes.
    x = put(1)
    f = colocated.colocated_python(lambda x: x + 41).specialize(out_specs_fn=lambda x: x)
    before = _colocated.local_values()
    calls = [f(x) for _ in range(3)]
    del f
    gc.collect()
    assert [int(y) for y in calls] == [42, 42, 42]
    # And goes with the program, once the calls ran.
    del calls
    deadline = time.monotonic() + WAIT
    while _colocated.local_values() > before and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert _colocated.local_values() <= before


def test_a_reference_of_another_process_is_refused_at_load():
    # A payload naming a value of another process (or one released) does not
    # load: a typed error, not a crash.
    local = _colocated.LocalProgram(lambda impls: impls)
    reference = local.reference
    prefix, token, key = reference.decode().split(":")
    foreign = f"{prefix}:{int(token, 16) ^ 1:016x}:{key}".encode()
    assert int(key) > 0
    for payload, message in ((foreign, "another process"), (reference[: -len(key)] + b"0", "names no value")):
        with pytest.raises(colocated.InvalidArgumentError, match=message):
            _compile_python_payload(payload)


def _compile_python_payload(payload: bytes):
    """Compiles a `python` program of ``payload`` on this process's first device."""
    x = put(1)
    device = next(iter(x.sharding.device_set))
    spec = _colocated_python._spec_leaf(x)
    return _colocated.Executable.compile("probe", payload, [spec], [spec], [device])
