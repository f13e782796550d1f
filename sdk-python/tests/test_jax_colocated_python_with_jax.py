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

# JAX's colocated Python tests (the body in colocated_python_port.py) with real
# JAX: the tests' arrays are jax.Arrays on JAX's CPU devices, which
# colocated's functions take and return (JAX's CPU device k is colocated's CPU
# device k). `jax_port` (beside this file) gives what the tests import from
# JAX's colocated Python (see its docstring).

import pathlib
import runpy

import jax
import jax.numpy as jnp
from absl.testing import absltest
from jax._src import config
from jax._src.sharding_impls import make_single_device_sharding
from jax_port import ifrt_programs, serialization
from jax_port import test_util as jtu

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
        "NO_PRNG_KEYS": None,
    },
    run_name="colocated_python_port_with_jax",
)
ColocatedPythonTest = _PORT["ColocatedPythonTest"]


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
