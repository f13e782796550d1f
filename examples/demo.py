"""The JAX colocated Python documentation's examples, on colocated's local host.

Each block is the documentation's example with `jax` replaced by `colocated`;
it prints what the documentation shows. Run by `make demo`.
"""

import concurrent.futures
import os
import tempfile
import threading
import time

import colocated
import numpy as np
from colocated import colocated_python as colocated_python_fn

print("== Colocated CPU devices")
devices = colocated.devices()
cpu_devices = colocated.colocated_cpu_devices(devices[:1])
print(cpu_devices)

cpu_mesh = colocated.Mesh(cpu_devices, ["x"])
cpu_sharding = colocated.NamedSharding(cpu_mesh, colocated.P())
x = colocated.device_put(np.int32(1), cpu_sharding)

print("== Colocated Python function")


def f(x):
    return x + 1


f = colocated_python_fn(f)
y = f(x)
assert y.sharding == x.sharding
print(y)

path = os.path.join(tempfile.mkdtemp(), "foo")


def write(x):
    with open(path, "w") as out:
        out.write(str(x))
    return x


write = colocated_python_fn(write)
print(repr(colocated.block_until_ready(write(x))))
with open(path) as written:
    print("the host wrote:", written.read())

print("== Specialization")
f = colocated_python_fn(lambda x: x + 1).specialize(out_specs_fn=lambda x: x)
y = f(x)
assert y.sharding == x.sharding
print(y)

g = colocated_python_fn(lambda x: x + 1).specialize(
    in_specs=((colocated.ShapeDtypeStruct(shape=(), dtype=np.int32, sharding=cpu_sharding),), {}),
    out_specs_fn=lambda x: colocated.ShapeDtypeStruct(shape=(), dtype=np.int32, sharding=cpu_sharding),
)
print(g(x))


def touch():
    with open(path, "w") as out:
        out.write("foo")


touch = colocated_python_fn(touch).specialize(devices=cpu_devices)
touch()
with open(path) as written:
    print("the zero-argument function wrote:", written.read())

print("== Colocated Python class")


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
y = adder.add(x)
print(y)
del adder
time.sleep(0.2)  # destruction is asynchronous

print("== Execution order and concurrency")


def slow(x):
    time.sleep(1)
    return x + 1


slow = colocated_python_fn(slow).specialize(out_specs_fn=lambda x: x)  # calls are asynchronous
# Calls return at once, so a pool may run both submissions on one thread (one
# stream: program order). Meeting at a barrier first puts them on two threads.
two_threads = threading.Barrier(2)


def call_from_own_thread(x):
    two_threads.wait(timeout=10)
    return slow(x)


start = time.perf_counter()
with concurrent.futures.ThreadPoolExecutor(2) as executor:
    fut1 = executor.submit(call_from_own_thread, x)
    fut2 = executor.submit(call_from_own_thread, x)
    colocated.block_until_ready([fut1.result(), fut2.result()])
print(f"two 1-second calls from two threads took {time.perf_counter() - start:.1f} s")
