# Copyright 2024 The JAX Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     https://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

# JAX's colocated Python tests (the body in colocated_python_port.py) with
# `jax_shim` (beside this file), which maps the parts of `jax` that the tests
# use onto colocated and numpy, locally and, in `ColocatedPythonWorkerHostTest`,
# against a worker host. The shim has no PRNG key arrays (JAX's `jax.random`):
# the tests that need them are skipped here, and
# `test_jax_colocated_python_with_jax.py` runs them with real JAX.

import pathlib
import runpy

import jax_shim as jax
from absl.testing import absltest
from jax_shim import config, ifrt_programs, make_single_device_sharding, serialization
from jax_shim import numpy as jnp
from jax_shim import test_util as jtu

config.parse_flags_with_absl()
jtu.request_cpu_devices(8)

_PORT = runpy.run_path(
    str(pathlib.Path(__file__).with_name("colocated_python_port.py")),
    init_globals={
        "jax": jax,
        "jnp": jnp,
        "jtu": jtu,
        "ifrt_programs": ifrt_programs,
        "serialization": serialization,
        "make_single_device_sharding": make_single_device_sharding,
        "NO_PRNG_KEYS": "jax_shim has no jax.random; test_jax_colocated_python_with_jax.py runs this with real JAX",
    },
    run_name="colocated_python_port_shim",
)
ColocatedPythonTest = _PORT["ColocatedPythonTest"]


# Not in JAX's file: the same tests against the devices of a worker host.


class ColocatedPythonWorkerHostTest(ColocatedPythonTest):
  """The tests of `ColocatedPythonTest` against a worker host with 8 CPU
  devices (`python -m colocated.worker`), through a client that is not the
  default one (`colocated.connect(..., default=False)`)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.enterClassContext(jax.worker_host(num_devices=8))


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
