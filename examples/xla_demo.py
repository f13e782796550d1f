"""XLA programs on a PJRT plugin's devices, next to colocated Python.

XLA's CPU plugin (the PyPI package ``lammps-jax-pjrt-cpu``) stands in for a
GPU here; with ``jax-cuda13-pjrt`` installed, ``pjrt_plugin="cuda"`` runs the
same code on GPUs. Run by ``make demo``.
"""

import colocated
import numpy as np

colocated.configure(num_cpu_devices=2, pjrt_plugin="cpu", pjrt_options={"cpu_device_count": 4})

print("== Backends")
print("default backend:", colocated.default_backend())
accelerators = colocated.devices()
print("its devices:", accelerators, "platform", accelerators[0].platform)
print("CPU devices for colocated Python:", colocated.devices("cpu"))

# What jax.jit(lambda x, w: jnp.tanh(x @ w) + 1).lower(x, w).as_text() gives,
# for a batch split four ways over a mesh axis "batch" (Shardy).
STEP = """
module @jit_step attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["batch"=4]>
  func.func public @main(%x: tensor<8x3xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"batch"}, {}]>},
                         %w: tensor<3x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>})
      -> (tensor<8x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"batch"}, {}]>}) {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x3xf32>, tensor<3x2xf32>) -> tensor<8x2xf32>
    %1 = stablehlo.tanh %0 : tensor<8x2xf32>
    %c = stablehlo.constant dense<1.0> : tensor<8x2xf32>
    %2 = stablehlo.add %1, %c : tensor<8x2xf32>
    return %2 : tensor<8x2xf32>
  }
}
"""

print("== An SPMD program over the four plugin devices")
step = colocated.compile_stablehlo(STEP, accelerators)
mesh = colocated.Mesh(accelerators, ("batch",))
x = colocated.device_put(
    np.arange(24, dtype=np.float32).reshape(8, 3) / 24, colocated.NamedSharding(mesh, colocated.P("batch"))
)
w = colocated.device_put(np.ones((3, 2), np.float32), colocated.NamedSharding(mesh, colocated.P()))
y = step(x, w)  # returns at once
print(np.asarray(y).round(3))
print("each device holds", [s.data.shape for s in y.addressable_shards])
np.testing.assert_allclose(np.asarray(y), np.tanh(np.asarray(x) @ np.ones((3, 2))) + 1, rtol=1e-5)

print("== Colocated Python next to the accelerator's data")
cpu = colocated.colocated_cpu_devices(accelerators[:1])[0]


@colocated.colocated_python
def rescale(a):
    # Runs on the CPU device of the host that owns the data (numpy's ufuncs
    # work on colocated Arrays).
    return (a - 1) * 100


first_shard = y.addressable_shards[0].data
print("device 0's rows, rescaled on its host's CPU:")
print(np.asarray(rescale(colocated.device_put(first_shard, cpu))).round(1))
