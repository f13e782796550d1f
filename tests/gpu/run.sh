#!/bin/sh
# The PJRT device tests and benchmark on a machine with an NVIDIA GPU, JAX and
# jax-cuda13-pjrt (or jax-cuda12-pjrt) installed, without Rust and without a
# network. It takes what `make gpu-bundle` built elsewhere (build/gpu: the
# Python SDK's release wheel, the wheels it needs beyond JAX's, the release
# benchmark binary), finds xla_cuda_plugin.so itself, and runs:
#
#   1. sdk-python/tests/test_pjrt.py on the GPU's devices (COLOCATED_TEST_PJRT=cuda);
#   2. the XLA benchmark (core/benches/pjrt.rs) on the GPU, beside the raw PJRT C API.
#
# Usage, from the repository root:  sh tests/gpu/run.sh   (under 5 minutes)
set -eu
cd "$(dirname "$0")/../.."
BUNDLE=build/gpu
PYTHON=${PYTHON:-python3}
[ -d "$BUNDLE" ] || { echo "no $BUNDLE: run make gpu-bundle on a machine with Rust first" >&2; exit 2; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# The CUDA plugin JAX uses: jax_plugins.xla_cuda13, else xla_cuda12.
PLUGIN=$("$PYTHON" - <<'PY'
import importlib.util, os
for name in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        continue
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(location, "xla_cuda_plugin.so")
        if os.path.exists(path):
            print(path)
            raise SystemExit
raise SystemExit("no jax_plugins.xla_cuda13 or xla_cuda12 with xla_cuda_plugin.so is installed")
PY
)
echo "plugin: $PLUGIN"

# A venv over the system's packages (numpy, ml_dtypes, JAX), with the SDK and
# what it needs beyond them from the bundle only.
VENV=$(mktemp -d)/venv
"$PYTHON" -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install --quiet --no-index --find-links "$BUNDLE/wheels" colocated pytest

# The CUDA libraries JAX's cuda extras install (nvidia-* wheels) on the loader's path.
NVIDIA_LIBS=$("$VENV/bin/python" - <<'PY'
import glob, os, site
dirs = []
for root in site.getsitepackages():
    dirs += glob.glob(os.path.join(root, "nvidia", "*", "lib"))
print(":".join(dirs))
PY
)
export LD_LIBRARY_PATH="${NVIDIA_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# The allocator takes memory as it needs it (JAX's XLA_PYTHON_CLIENT_PREALLOCATE=false).
export COLOCATED_TEST_PJRT=cuda
export COLOCATED_TEST_PJRT_OPTIONS='{"preallocate": false}'
echo "== device tests (sdk-python/tests/test_pjrt.py on $PLUGIN)"
cd sdk-python/tests
timeout 180 "$VENV/bin/python" -m pytest -q -rs test_pjrt.py
cd ../..

echo "== benchmark (core/benches/pjrt.rs)"
COLOCATED_TEST_PJRT_PLUGIN="$PLUGIN" COLOCATED_BENCH_PJRT_OPTIONS="preallocate=false" \
  timeout 90 "$BUNDLE/bench_pjrt" --bench
