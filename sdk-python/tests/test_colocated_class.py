"""colocated_python_class: objects that live on the hosts of their calls' devices.

The class scenarios of the JAX colocated Python documentation and of JAX's test
suite (tests/colocated_python_test.py), re-expressed for colocated, then what we
do beyond JAX: specialized methods, methods without array arguments, objects
passed to other colocated calls, ``clear_caches()`` that spares live objects.

As in test_colocated_python.py, host code shares state with the test through a
module registered in ``sys.modules`` (sent by name by cloudpickle), and every
wait is bounded.
"""

import gc
import threading
import time

import numpy as np
import pytest
from colocated_helpers import GATE_WAIT, cpu, error_text, eventually, outcome, put, wait_bounded

import colocated
from colocated import Mesh, NamedSharding, P, ShapeDtypeStruct, SingleDeviceSharding


def make_counter_class(state):
    """A counter class that records constructions and destructions in ``state``."""
    state.constructed = 0
    state.destroyed = 0

    class Counter:
        def __init__(self, start=0):
            state.constructed += 1
            self.count = start

        def __del__(self):
            state.destroyed += 1

        def incr(self, x):
            self.count += 1
            return colocated.device_put(np.int32(self.count), x.sharding)

    return colocated.colocated_python_class(Counter)


# -- the documentation's example ---------------------------------------------------------


def test_docs_example_adder(capfd):
    cpu_sharding = NamedSharding(Mesh(cpu(1), ("x",)), P())

    class Adder:
        def __init__(self, increment):
            print("Adder created")
            self.increment = increment

        def __del__(self):
            print("Adder destroyed")

        def add(self, x):
            return x + self.increment

    Adder = colocated.colocated_python_class(Adder)
    adder = Adder(1)
    assert "Adder created" not in capfd.readouterr().out  # captured, not yet built
    x = colocated.device_put(np.int32(1), cpu_sharding)
    y = adder.add(x)
    assert y.sharding == x.sharding
    print(int(y))
    assert capfd.readouterr().out == "Adder created\n2\n"

    del adder
    printed = []
    assert eventually(lambda: printed.append(capfd.readouterr().out) or "Adder destroyed" in "".join(printed))
    assert "".join(printed).count("Adder destroyed") == 1


# -- lifecycle ---------------------------------------------------------------------------


def test_object_lifecycle(state):
    d0 = cpu(1)[0]
    sharding = SingleDeviceSharding(d0)

    class Object:
        def __init__(self):
            state.initialized = True

        def __del__(self):
            state.destroyed = True

        def echo(self, x):
            return x

    Object = colocated.colocated_python_class(Object)

    @colocated.colocated_python
    def check_initialized():
        return colocated.device_put(np.array(getattr(state, "initialized", False)), sharding)

    @colocated.colocated_python
    def check_destroyed():
        return colocated.device_put(np.array(getattr(state, "destroyed", False)), sharding)

    check_initialized = check_initialized.specialize(devices=[d0])
    check_destroyed = check_destroyed.specialize(devices=[d0])

    # Construction waits for the first method call; an object never used is
    # never built, so never destroyed either.
    obj = Object()
    assert not bool(check_initialized()) and not bool(check_destroyed())
    del obj
    gc.collect()
    time.sleep(0.1)
    assert not bool(check_initialized()) and not bool(check_destroyed())

    # The first method call builds the object on the host.
    obj = Object()
    assert not bool(check_initialized())
    assert int(colocated.block_until_ready(obj.echo(put(1)))) == 1
    assert bool(check_initialized()) and not bool(check_destroyed())
    # Still alive while the wrapper is.
    assert int(obj.echo(put(2))) == 2
    assert not bool(check_destroyed())

    # Dropping the wrapper destroys it on the host, asynchronously.
    del obj
    assert eventually(lambda: bool(check_destroyed()))
    assert bool(check_initialized())


def test_constructor_runs_lazily_once_per_host(state):
    Counter = make_counter_class(state)
    d0, d1 = cpu(2)
    counter = Counter(10)
    assert state.constructed == 0
    assert int(counter.incr(put(0, d0))) == 11
    assert state.constructed == 1
    # Other devices of the same host reach the same object.
    assert int(counter.incr(put(0, d1))) == 12
    both = colocated.device_put(np.int32(0), NamedSharding(Mesh([d0, d1], ("x",)), P()))
    out = counter.incr(both)
    assert out.sharding == both.sharding and int(out) == 13
    assert state.constructed == 1 and state.destroyed == 0


def test_constructor_exception_is_reraised_to_every_call(state):
    state.attempts = 0

    class Fragile:
        def __init__(self):
            state.attempts += 1
            raise RuntimeError("constructor failed on the host")

        def echo(self, x):
            return x

        def other(self, x):
            return x + 1

    obj = colocated.colocated_python_class(Fragile)()
    for method, value in [(obj.echo, 1), (obj.echo, 2), (obj.other, 3)]:
        err = outcome(lambda method=method, value=value: method(put(value)))
        assert isinstance(err, (colocated.ColocatedError, RuntimeError)), repr(err)
        assert "constructor failed on the host" in error_text(err)
    assert state.attempts == 1


def test_independent_objects_have_independent_state(state):
    Counter = make_counter_class(state)
    a, b = Counter(), Counter(100)
    x = put(0)
    assert int(a.incr(x)) == 1
    assert int(a.incr(x)) == 2
    assert int(b.incr(x)) == 101
    assert int(a.incr(x)) == 3
    assert state.constructed == 2


# -- state -------------------------------------------------------------------------------


def test_stateful_object():
    class Value:
        def __init__(self, initial_value):
            self.value = initial_value

        def add(self, x):
            self.value = self.value + np.asarray(x)
            return colocated.device_put(self.value, x.sharding)

        def fetch_like(self, x):
            return colocated.device_put(self.value, x.sharding)

    value = colocated.colocated_python_class(Value)(np.array(5, np.int32))
    x = put(1)
    assert int(value.add(x)) == 6
    assert int(value.add(x)) == 7
    assert int(value.fetch_like(x)) == 7

    # Later calls are asynchronous and run in program order.
    outs = [value.add(x) for _ in range(20)]
    assert [int(y) for y in wait_bounded(outs)] == list(range(8, 28))
    assert int(value.fetch_like(x)) == 27


def test_object_with_captured_shardings():
    d0, d1 = cpu(2)
    mesh = Mesh([d0, d1], ("x",))
    sharding1 = NamedSharding(mesh, P())
    sharding2 = NamedSharding(mesh, P("x"))

    class Value:
        def __init__(self, initial_value):
            self.value = initial_value
            self.sharding1 = sharding1  # captured in the closure
            self.sharding2 = sharding2

        def add_sharding1(self, x):
            self.value = self.value + np.asarray(x)
            return colocated.device_put(self.value, self.sharding1)

        def add_sharding2(self, x):
            self.value = self.value + np.asarray(x)
            return colocated.device_put(self.value, self.sharding2)

    value = colocated.colocated_python_class(Value)(np.array([5, 15], np.int32))
    x = colocated.device_put(np.array([1], np.int32), NamedSharding(mesh, P()))

    out = value.add_sharding1(x)
    assert out.sharding == sharding1
    np.testing.assert_array_equal(np.asarray(out), np.array([6, 16]))

    out = value.add_sharding2(x)
    assert out.sharding == sharding2
    np.testing.assert_array_equal(np.asarray(out), np.array([7, 17]))
    assert [np.asarray(s.data).tolist() for s in out.addressable_shards] == [[7], [17]]


def test_method_exception_surfaces_and_object_survives():
    class Checker:
        def __init__(self):
            self.accepted = 0

        def check_positive(self, x):
            if int(np.asarray(x)) < 0:
                raise ValueError("negative input rejected on the host")
            self.accepted += 1
            return colocated.device_put(np.int32(self.accepted), x.sharding)

    checker = colocated.colocated_python_class(Checker)()
    assert int(checker.check_positive(put(1))) == 1
    err = outcome(lambda: checker.check_positive(put(-1)))
    assert isinstance(err, (colocated.ColocatedError, ValueError)), repr(err)
    text = error_text(err)
    assert "check_positive" in text and "negative input rejected on the host" in text
    # The object and its state survive the failed call.
    assert int(checker.check_positive(put(2))) == 2


# -- methods: specialization and calls without array arguments ---------------------------


def test_method_specialization_with_devices():
    cpu_devices = cpu(1)
    sharding = SingleDeviceSharding(cpu_devices[0])

    class Object:
        def __init__(self, sharding):
            self.sharding = sharding

        def fetch_with_devices(self):
            return colocated.device_put(np.array(1, dtype=np.int32), self.sharding)

        def fetch_with_output_spec(self):
            return colocated.device_put(np.array(1, dtype=np.int32), self.sharding)

    obj = colocated.colocated_python_class(Object)(sharding)

    for method in (obj.fetch_with_devices, obj.fetch_with_output_spec):
        with pytest.raises(ValueError, match="devices"):
            colocated.block_until_ready(method())

    obj.fetch_with_devices = obj.fetch_with_devices.specialize(devices=cpu_devices)
    out = obj.fetch_with_devices()
    assert out.dtype == np.int32 and int(out) == 1

    obj.fetch_with_output_spec = obj.fetch_with_output_spec.specialize(
        devices=cpu_devices,
        out_specs_fn=lambda: ShapeDtypeStruct(shape=(), dtype=np.int32, sharding=sharding),
    )
    out = obj.fetch_with_output_spec()
    assert out.sharding == sharding and int(out) == 1


def test_method_specialization_with_out_specs_fn_is_asynchronous(state):
    state.gate = threading.Event()
    state.finished = []

    class Gated:
        def __init__(self):
            self.calls = 0

        def add_one(self, x):
            opened = state.gate.wait(GATE_WAIT)
            self.calls += 1
            state.finished.append(opened)
            return x + 1

        def count_like(self, x):
            return colocated.device_put(np.int32(self.calls), x.sharding)

    obj = colocated.colocated_python_class(Gated)()
    add_one = obj.add_one.specialize(out_specs_fn=lambda x: x)
    x = put(1)
    ys = [add_one(x), add_one(x)]  # returns before the method can finish
    assert state.finished == []
    assert not any(y.is_ready() for y in ys)
    state.gate.set()
    assert [int(y) for y in wait_bounded(ys)] == [2, 2]
    assert state.finished == [True, True]
    # The specialized method ran on the same object as the plain one.
    assert int(obj.count_like(x)) == 2


def test_zero_argument_method_with_devices_shares_the_object():
    d0 = cpu(1)[0]
    sharding = SingleDeviceSharding(d0)

    class Tally:
        def __init__(self):
            self.n = 0

        def incr(self, x):
            self.n += 1
            return x

        def total(self):
            return colocated.device_put(np.int32(self.n), sharding)

    tally = colocated.colocated_python_class(Tally)()
    total = tally.total.specialize(devices=[d0])
    assert int(total()) == 0  # the first call builds the object
    x = put(7)
    tally.incr(x)
    tally.incr(x)
    out = total()  # program order: after both increments
    assert out.sharding.device_set == {d0}
    assert int(out) == 2


# -- objects in other calls ----------------------------------------------------------------


def test_object_passed_to_another_colocated_call(state):
    Counter = make_counter_class(state)
    counter = Counter()

    @colocated.colocated_python
    def bump_through(counter, x):
        return counter.incr(x)

    x = put(0)
    assert int(bump_through(counter, x)) == 1  # the first use builds it on the host
    assert int(counter.incr(x)) == 2
    assert int(bump_through(counter, x)) == 3
    assert state.constructed == 1 and state.destroyed == 0


# -- caches --------------------------------------------------------------------------------


def test_clear_caches_never_destroys_live_objects(state):
    Counter = make_counter_class(state)
    counter = Counter()
    x = put(0)
    for expected in (1, 2, 3):
        assert int(counter.incr(x)) == expected
        colocated.clear_caches()
    assert int(counter.incr(x)) == 4
    gc.collect()
    assert state.constructed == 1 and state.destroyed == 0
    # A new object after the clears is built and lives on its own.
    other = Counter()
    assert int(other.incr(x)) == 1
    assert state.constructed == 2
    del counter
    assert eventually(lambda: state.destroyed == 1)
    assert int(other.incr(x)) == 2
    del other
    assert eventually(lambda: state.destroyed == 2)


def test_an_object_passed_to_a_queued_call_is_destroyed_after_that_call(state):
    Counter = make_counter_class(state)
    gate = threading.Event()
    counter = Counter()
    x = put(1)
    counter.incr(x)
    assert (state.constructed, state.destroyed) == (1, 0)

    @colocated.colocated_python
    def blocker(x):
        gate.wait(GATE_WAIT)
        return x

    @colocated.colocated_python
    def uses(c, x):
        return c.incr(x)

    blocker = blocker.specialize(out_specs_fn=lambda x: x)
    uses = uses.specialize(out_specs_fn=lambda c, x: x)
    first = blocker(x)  # holds the thread's program order
    y = uses(counter, x)  # queued behind it, with the object as an argument
    del counter
    gc.collect()
    assert state.destroyed == 0, "destroyed before a call that uses it ran"
    gate.set()
    assert int(wait_bounded(y)) == 2, "the queued call found the object, not a new one"
    wait_bounded(first)
    assert eventually(lambda: state.destroyed == 1), "the object is destroyed once the call ran"
    assert state.constructed == 1
