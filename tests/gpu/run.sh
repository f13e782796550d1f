#!/bin/sh
# The PJRT device tests and benchmark on a machine with an NVIDIA GPU, JAX and
# jax-cuda13-pjrt (or jax-cuda12-pjrt) installed, without Rust and without a
# network. It takes what `make gpu-bundle` built elsewhere (build/gpu: the
# Python SDK's release wheel, the wheels it needs beyond JAX's, the release
# benchmark binary), finds xla_cuda_plugin.so itself, and runs:
#
#   1. sdk-python/tests/test_pjrt.py on the GPU's devices (COLOCATED_TEST_PJRT=cuda),
#      and test_jax_gpu.py (jax.Arrays on the GPU in and out, JAX on the GPU too);
#   2. the XLA benchmark (core/benches/pjrt.rs) on the GPU, beside the raw PJRT C API;
#   3. sdk-python/bench/bench_xla.py: colocated.jit on the GPU beside jax.jit on
#      JAX's own client of it, and the step on a worker's GPU beside TCP.
#
# Usage, from the repository root:  sh tests/gpu/run.sh   (under 5 minutes;
# PYTHON names the Python that has JAX, default python3)
#
# COLOCATED_GPU_RUN_PLATFORM=cpu runs the same steps on XLA's CPU plugin (the
# package lammps-jax-pjrt-cpu, installed beside JAX): a check of the script
# itself on a machine without a GPU.
set -eu
cd "$(dirname "$0")/../.."
BUNDLE=build/gpu
PYTHON=${PYTHON:-python3}
[ -d "$BUNDLE" ] || { echo "no $BUNDLE: run make gpu-bundle on a machine with Rust first" >&2; exit 2; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

PLATFORM=${COLOCATED_GPU_RUN_PLATFORM:-cuda}
# The CUDA plugin JAX uses: jax_plugins.xla_cuda13, else xla_cuda12 (for the
# check on a CPU: XLA's CPU plugin package).
PLUGIN=$(PLATFORM="$PLATFORM" "$PYTHON" - <<'PY'
import importlib.util, os
packages = {"cuda": [("jax_plugins.xla_cuda13", "xla_cuda_plugin.so"), ("jax_plugins.xla_cuda12", "xla_cuda_plugin.so")],
            "cpu": [("lammps_jax_pjrt_cpu", "pjrt_c_api_cpu_plugin.so")]}[os.environ["PLATFORM"]]
for name, library in packages:
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        continue
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(location, library)
        if os.path.exists(path):
            print(path)
            raise SystemExit
raise SystemExit(f"none of {[n for n, _ in packages]} is installed")
PY
)
echo "plugin: $PLUGIN"

# The SDK, and what it and the tests need beyond what the Python of JAX has,
# from the bundle only, into a folder of their own on PYTHONPATH (JAX may
# live in a venv, which a new venv would not see).
SITE=$(mktemp -d)/site
pip_bundle() { "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index \
  --upgrade --find-links "$BUNDLE/wheels" --target "$SITE" "$@"; }
pip_bundle --no-deps colocated
for module in optree cloudpickle pytest; do
  "$PYTHON" -c "import $module" 2>/dev/null || pip_bundle "$module"
done
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"

# The CUDA libraries JAX's cuda extras install (nvidia-* wheels) on the loader's path.
NVIDIA_LIBS=$("$PYTHON" - <<'PY'
import glob, os, site
dirs = []
for root in site.getsitepackages():
    dirs += glob.glob(os.path.join(root, "nvidia", "*", "lib"))
print(":".join(dirs))
PY
)
export LD_LIBRARY_PATH="${NVIDIA_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# The allocator takes memory as it needs it (JAX's XLA_PYTHON_CLIENT_PREALLOCATE=false).
export COLOCATED_TEST_PJRT="$PLATFORM"
if [ "$PLATFORM" = cuda ]; then
  export COLOCATED_TEST_PJRT_OPTIONS='{"preallocate": false}'
  BENCH_OPTIONS=preallocate=false
else
  BENCH_OPTIONS=cpu_device_count=1
fi
export TF_CPP_MIN_LOG_LEVEL=1
# JAX (which some tests use to lower modules) stays on the CPU: the GPU is the
# SDK's plugin's alone, and JAX's own CUDA client would take most of its
# memory when it starts.
export JAX_PLATFORMS=cpu
echo "== device tests (sdk-python/tests/test_pjrt.py on $PLUGIN)"
cd sdk-python/tests
timeout 180 "$PYTHON" -m pytest -q -rs -p no:cacheprovider test_pjrt.py
echo "== jax.Array <-> colocated on the GPU (sdk-python/tests/test_jax_gpu.py; JAX on the GPU too)"
JAX_PLATFORMS="$PLATFORM,cpu" XLA_PYTHON_CLIENT_PREALLOCATE=false \
  timeout 120 "$PYTHON" -m pytest -q -rs -p no:cacheprovider test_jax_gpu.py
cd ../..

echo "== benchmark (core/benches/pjrt.rs)"
COLOCATED_TEST_PJRT_PLUGIN="$PLUGIN" COLOCATED_BENCH_PJRT_OPTIONS="$BENCH_OPTIONS" \
  timeout 90 "$BUNDLE/bench_pjrt" --bench

echo "== benchmark (sdk-python/bench/bench_xla.py: colocated.jit beside jax.jit)"
# Here JAX takes the GPU too (its own client, memory taken as it needs it).
cd sdk-python/bench
JAX_PLATFORMS="$PLATFORM,cpu" XLA_PYTHON_CLIENT_PREALLOCATE=false \
  COLOCATED_BENCH_PJRT_PLUGIN="$PLUGIN" COLOCATED_BENCH_PJRT_OPTIONS="$BENCH_OPTIONS" \
  timeout 150 "$PYTHON" bench_xla.py
