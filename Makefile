# colocated — build, demo, test, bench, lint.
#   make demo   builds everything and runs the demo
#   make test   runs every test
#   make python builds the Python SDK into build/venv (make test-python tests it)
#   make node   builds the Node SDK's release addon in sdk-node, as `npm pack`
#               ships it (make node-debug: a debug build; make test-node tests it)
#   make fuzz   runs each fuzz target (fuzz/) for FUZZ_SECONDS
#
# Set-up: these targets bring what they need and the machine lacks, without
# root and without installing anything system-wide: Python packages (cmake and
# ruff among them) into build/venv, cbindgen and cargo-fuzz into build/tools
# (`cargo install --locked --root`), npm packages into sdk-node/node_modules
# (`npm ci`). They expect Rust (cargo), a C compiler, Python 3 with venv,
# pkg-config, and Node 20+ with npm; `make check-prerequisites` says what is missing and how
# to get it.
CARGO ?= cargo
CC ?= cc
PYTHON ?= python3
TARGET_DIR := $(CURDIR)/target
DEBUG_DIR := $(TARGET_DIR)/debug
BUILD := $(CURDIR)/build
CBINDGEN_VERSION := 0.29.4
CARGO_FUZZ_VERSION := 0.13.2
FUZZ_TARGETS := executable_format control_messages buffer_chunks router_requests colocated_protocol lane_bytes
FUZZ_SECONDS ?= 20
export CARGO_TARGET_DIR := $(TARGET_DIR)
VENV := $(BUILD)/venv
VENV_PY := $(VENV)/bin/python
RUFF_VERSION := 0.17.6
CMAKE_PY_VERSION := 4.4.5
# XLA's CPU PJRT plugin (pjrt_c_api_cpu_plugin.so), the plugin the tests run on.
PJRT_CPU_PLUGIN_VERSION := 0.11.2
# JAX (on CPU), whose lowered and exported modules the XLA tests compile.
JAX_VERSION := 0.10.2
# cmake (for the install check's CMake build) and ruff (make lint) come from
# PyPI too, so that no system package is needed for them.
PY_DEPS := maturin numpy optree ml_dtypes cloudpickle pytest tqdm absl-py pyyaml kubernetes-validate ray \
  cmake==$(CMAKE_PY_VERSION) ruff==$(RUFF_VERSION) lammps-jax-pjrt-cpu==$(PJRT_CPU_PLUGIN_VERSION) \
  jax==$(JAX_VERSION)
# The venv is made again when the list above changes (its stamp names the list's checksum).
VENV_STAMP := $(VENV)/.deps-$(shell echo '$(PY_DEPS)' | cksum | cut -d ' ' -f 1)
# Tools built from crates.io, kept in the build folder.
TOOLS := $(BUILD)/tools
CBINDGEN := $(TOOLS)/bin/cbindgen
BINDGEN_VERSION := 0.72.1
BINDGEN := $(TOOLS)/bin/bindgen
CARGO_FUZZ := $(TOOLS)/bin/cargo-fuzz
NODE_DIR := $(CURDIR)/sdk-node
NODE_BIN := $(NODE_DIR)/node_modules/.bin
NODE_DEPS := $(NODE_DIR)/node_modules/.package-lock.json
PLUGIN := $(BUILD)/libadd_one_plugin.so

CFLAGS_COMMON := -std=c11 -Wall -Wextra -Wno-missing-field-initializers -Werror -Iinclude
LDLIBS := -lpthread -ldl -lm

# `make install PREFIX=...`: libcolocated (shared, with its SONAME and
# versioned symbols; static), the header, a pkg-config file and a CMake
# package. PROFILE=debug installs the debug build (the tests do).
PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib
PROFILE ?= release
INSTALL_LIB_DIR := $(TARGET_DIR)/$(PROFILE)
API_MAJOR := $(shell sed -n 's/^\#define COLOCATED_API_VERSION_MAJOR \([0-9]*\)/\1/p' include/colocated.h)
API_MINOR := $(shell sed -n 's/^\#define COLOCATED_API_VERSION_MINOR \([0-9]*\)/\1/p' include/colocated.h)
RELEASE := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
SONAME := libcolocated.so.$(API_MAJOR)
SOFILE := $(SONAME).$(API_MINOR).0
# What the static library needs (`rustc --print native-static-libs`).
NATIVE_LIBS := -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc

PHONY_EXTRA := gpu-bundle pjrt-bindings check-pjrt-bindings bench-rust bench-python bench-node fuzz fuzz-tools node node-debug test-node check-prerequisites venv check-node-binding install test-install wheel test-wheel
.PHONY: all build demo test test-rust test-c test-abi test-python python $(PHONY_EXTRA) check-header header abi-manifest bench lint tools clean

all: build

build:
	$(CARGO) build --workspace

tools: $(CBINDGEN)

# What the targets expect of the machine (everything else they bring), and how
# to get what is missing. Run by `make demo` and `make test` first.
check-prerequisites:
	@missing=0; \
	need() { if ! command -v $$1 >/dev/null 2>&1; then echo "make: '$$1' is missing: $$2" >&2; missing=1; fi; }; \
	need $(CARGO) "install Rust (https://rustup.rs)"; \
	need $(CC) "install a C compiler (Debian: apt-get install build-essential)"; \
	need $(PYTHON) "install Python 3.10+ (Debian: apt-get install python3 python3-venv)"; \
	need node "install Node.js 20+ with npm (Debian: apt-get install nodejs npm)"; \
	need npm "install npm (Debian: apt-get install npm)"; \
	need pkg-config "install pkg-config (Debian: apt-get install pkg-config)"; \
	if command -v $(PYTHON) >/dev/null 2>&1 && ! $(PYTHON) -c "import ensurepip, venv" >/dev/null 2>&1; then \
	  echo "make: $(PYTHON) cannot make a venv (Debian: apt-get install python3-venv)" >&2; missing=1; fi; \
	if command -v node >/dev/null 2>&1 && [ "$$(node -p 'process.versions.node.split(".")[0]')" -lt 20 ]; then \
	  echo "make: Node.js $$(node --version) is older than 20" >&2; missing=1; fi; \
	exit $$missing

# cbindgen, built from crates.io into build/tools (not installed system-wide).
$(CBINDGEN):
	@echo "make: installing cbindgen $(CBINDGEN_VERSION) into $(TOOLS) (cargo install)"
	env -u CARGO_TARGET_DIR $(CARGO) install cbindgen --locked --quiet --version $(CBINDGEN_VERSION) --root $(TOOLS)

$(BUILD):
	mkdir -p $(BUILD)

demo: check-prerequisites build python node $(PLUGIN) | $(BUILD)
	$(CC) $(CFLAGS_COMMON) examples/demo.c -o $(BUILD)/demo -L$(DEBUG_DIR) -lcolocated -Wl,-rpath,$(DEBUG_DIR) $(LDLIBS)
	$(BUILD)/demo
	@echo
	COLOCATED_NUM_CPU_DEVICES=4 $(VENV_PY) examples/demo.py
	@echo
	$(VENV_PY) examples/cluster_demo.py
	@echo
	TF_CPP_MIN_LOG_LEVEL=1 $(VENV_PY) examples/xla_demo.py
	@echo
	TF_CPP_MIN_LOG_LEVEL=1 $(VENV_PY) examples/jax_cluster.py
	@echo
	COLOCATED_PLUGIN=$(PLUGIN) node examples/demo.mjs

# The example plugin (the tests' `plugin_add_one_i32` and `plugin_fail`).
$(PLUGIN): tests/plugin/add_one_plugin.c include/colocated.h | $(BUILD)
	$(CC) -std=c11 -shared -fPIC -Iinclude $< -o $@

# The Node SDK's npm packages, exactly as the committed lock file says.
$(NODE_DEPS): $(NODE_DIR)/package-lock.json
	cd $(NODE_DIR) && npm ci --no-audit --no-fund

# The Node addon and its generated binding (binding.js, binding.d.ts): the
# release build, which `npm pack` ships (its `prepack` builds it too), or
# the debug one for development. Both write sdk-node/colocated.*.node.
node: $(NODE_DEPS)
	cd $(NODE_DIR) && npm run --silent build

node-debug: $(NODE_DEPS)
	cd $(NODE_DIR) && npm run --silent build:debug

# The committed binding files must be what the Rust crate generates, as the
# C header must be what cbindgen generates.
check-node-binding: node
	@git diff --exit-code -- sdk-node/binding.js sdk-node/binding.d.ts || \
	  (echo "sdk-node/binding.js or binding.d.ts is stale: run 'make node' and commit them" && exit 1)

# Real worker processes (the `colocated` executable, and Python workers of
# the Python SDK for the cross-language test) on 127.0.0.1, some behind the
# fault proxy (tests/faultproxy), and the types as a TypeScript user sees them.
test-node: node python
	$(CARGO) build -p colocated-cli -p colocated-faultproxy
	cd $(NODE_DIR) && $(NODE_BIN)/tsc -p tsconfig.json
	cd $(NODE_DIR) && rm -rf tests/ts-out && $(NODE_BIN)/tsc -p tsconfig.decorators.json
	cd $(NODE_DIR) && $(PJRT_TEST_ENV) COLOCATED_PYTHON=$(VENV_PY) node --test --test-concurrency=1 tests/

header: tools
	cd ffi && $(CBINDGEN) --config cbindgen.toml --crate colocated-ffi --quiet --output ../include/colocated.h

check-header: tools | $(BUILD)
	cd ffi && $(CBINDGEN) --config cbindgen.toml --crate colocated-ffi --quiet --output $(BUILD)/colocated.h
	@diff -u include/colocated.h $(BUILD)/colocated.h || \
	  (echo "include/colocated.h is stale: run 'make header' and commit it" && exit 1)

test: check-prerequisites check-header test-rust test-c test-abi test-install test-python test-wheel check-node-binding test-node

install:
	$(CARGO) build -p colocated-ffi $(if $(filter release,$(PROFILE)),--release,)
	mkdir -p $(BUILD)/install
	@# The shared library is linked here from the static one, with the
	@# version script (rustc's own would hide ours).
	$(CC) -shared -Wl,--whole-archive $(INSTALL_LIB_DIR)/libcolocated.a -Wl,--no-whole-archive \
	  -Wl,--version-script=ffi/install/colocated.map -Wl,-soname,$(SONAME) -Wl,-z,relro,-z,now \
	  -Wl,--gc-sections $(NATIVE_LIBS) -o $(BUILD)/install/$(SOFILE)
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(LIBDIR)/cmake/colocated $(DESTDIR)$(PREFIX)/include
	install -m 755 $(BUILD)/install/$(SOFILE) $(DESTDIR)$(LIBDIR)/$(SOFILE)
	ln -sf $(SOFILE) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libcolocated.so
	install -m 644 $(INSTALL_LIB_DIR)/libcolocated.a $(DESTDIR)$(LIBDIR)/libcolocated.a
	install -m 644 include/colocated.h $(DESTDIR)$(PREFIX)/include/colocated.h
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@VERSION@|$(RELEASE)|' \
	  -e 's|@NATIVE_LIBS@|$(NATIVE_LIBS)|' ffi/install/colocated.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/colocated.pc
	sed -e 's|@LIBDIR_NAME@|$(notdir $(LIBDIR))|g' -e 's|@SOVERSION@|$(API_MAJOR)|g' \
	  -e 's|@CMAKE_NATIVE_LIBS@|$(subst $(eval) ,;,$(patsubst -l%,%,$(NATIVE_LIBS)))|' \
	  ffi/install/colocatedConfig.cmake.in > $(DESTDIR)$(LIBDIR)/cmake/colocated/colocatedConfig.cmake
	sed -e 's|@VERSION@|$(RELEASE)|' -e 's|@VERSION_MAJOR@|$(word 1,$(subst ., ,$(RELEASE)))|' \
	  -e 's|@VERSION_MINOR@|$(word 2,$(subst ., ,$(RELEASE)))|' \
	  ffi/install/colocatedConfigVersion.cmake.in > $(DESTDIR)$(LIBDIR)/cmake/colocated/colocatedConfigVersion.cmake

# An install (of the debug build) into build/prefix, and C programs built
# against it as users build theirs: pkg-config (shared and static) and CMake.
test-install: $(VENV_STAMP)
	rm -rf $(BUILD)/prefix
	$(MAKE) --no-print-directory install PREFIX=$(BUILD)/prefix PROFILE=debug
	PATH=$(VENV)/bin:$$PATH sh tests/install/check.sh $(BUILD)/prefix $(SONAME) $(SOFILE) $(RELEASE)

# The PJRT tests and benchmarks run on XLA's CPU plugin from build/venv.
PJRT_TEST_ENV = COLOCATED_TEST_PJRT_PLUGIN=$$($(VENV_PY) -c 'import lammps_jax_pjrt_cpu as p; print(p.PLUGIN_PATH)')

test-rust: $(VENV_STAMP)
	$(PJRT_TEST_ENV) $(CARGO) test --workspace

# Without the mimalloc feature, so LeakSanitizer sees every allocation. The
# shared cases' remote run starts the `colocated` executable as a worker.
test-c: $(VENV_STAMP) | $(BUILD)
	$(CARGO) build -p colocated-ffi --no-default-features
	$(CARGO) build -p colocated-cli
	$(PJRT_TEST_ENV) $(MAKE) -C tests/c run LIBDIR=$(DEBUG_DIR) BUILD=$(BUILD)/c

test-abi: build | $(BUILD)
	$(PYTHON) tests/abi/abi_manifest.py check --header include/colocated.h --lib $(DEBUG_DIR)/libcolocated.so --manifest tests/abi/manifest.json --build $(BUILD)/abi
	$(MAKE) -C tests/abi run LIBDIR=$(DEBUG_DIR) BUILD=$(BUILD)/abi

abi-manifest: build | $(BUILD)
	$(PYTHON) tests/abi/abi_manifest.py generate --header include/colocated.h --lib $(DEBUG_DIR)/libcolocated.so --manifest tests/abi/manifest.json --build $(BUILD)/abi

# The venv of the tests and tools (build/venv), made again when PY_DEPS change.
venv: $(VENV_STAMP)

$(VENV_STAMP): | $(BUILD)
	@echo "make: installing the Python packages of the build and tests into $(VENV)"
	test -x $(VENV_PY) || $(PYTHON) -m venv $(VENV)
	$(VENV_PY) -m pip install --quiet --disable-pip-version-check $(PY_DEPS)
	rm -f $(VENV)/.deps-* && touch $@

$(VENV_PY): $(VENV_STAMP)

# An editable debug build of sdk-python into the venv, sharing target/ (maturin
# develop: no wheel round trip and no release build).
python: $(VENV_PY)
	VIRTUAL_ENV=$(VENV) $(VENV)/bin/maturin develop --quiet --features testing -m sdk-python/Cargo.toml

# The fault proxy (tests/faultproxy) is a process for the Python tests (and the Node ones).
test-python: python
	$(CARGO) build -p colocated-faultproxy
	$(VENV_PY) -m pytest sdk-python/tests -q -rs

# The Python SDK's abi3 wheel, into build/wheels (PROFILE=debug: a debug build).
wheel: $(VENV_PY)
	$(VENV)/bin/maturin build --quiet -m sdk-python/Cargo.toml -o $(BUILD)/wheels \
	  $(if $(filter release,$(PROFILE)),--release,--profile dev)

# The wheel (a debug build) installed into a fresh venv: it is abi3, carries
# the native code, and installs the `colocated` command, which serves and reports.
test-wheel:
	rm -rf $(BUILD)/wheels
	$(MAKE) --no-print-directory wheel PROFILE=debug
	sh tests/install/wheel.sh $(BUILD)/wheels $(BUILD)/wheel-venv $(PYTHON)

# What tests/gpu/run.sh takes to a machine with a GPU but no Rust and no
# network (the device tool carries build/gpu): the Python SDK's release wheel,
# the wheels it and the tests need beyond JAX's (CPython 3.10-3.13), and the
# release XLA benchmark.
gpu-bundle: $(VENV_STAMP)
	rm -rf $(BUILD)/gpu && mkdir -p $(BUILD)/gpu/wheels
	$(VENV)/bin/maturin build --quiet --release -m sdk-python/Cargo.toml -o $(BUILD)/gpu/wheels
	for v in 3.10 3.11 3.12 3.13; do \
	  $(VENV_PY) -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
	    --platform manylinux2014_x86_64 --python-version $$v -d $(BUILD)/gpu/wheels optree cloudpickle pytest; \
	done
	$(CARGO) bench -p colocated-core --bench pjrt --no-run --message-format=json 2>/dev/null \
	  | $(VENV_PY) -c 'import json, sys; print(next(m["executable"] for m in map(json.loads, sys.stdin) if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "pjrt" and m.get("executable")))' \
	  | xargs -I{} cp {} $(BUILD)/gpu/bench_pjrt
	@du -sh $(BUILD)/gpu

BENCH_VENV := $(BUILD)/bench-venv

bench: bench-rust bench-python bench-node

bench-rust: $(VENV_STAMP)
	$(PJRT_TEST_ENV) $(CARGO) bench --workspace

# A release build of the SDK beside its baselines: jax[cpu] for local calls, Ray
# (and raw TCP) for calls to a worker process.
bench-python: | $(BUILD)
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --disable-pip-version-check "jax[cpu]" ray pytest \
	  lammps-jax-pjrt-cpu==$(PJRT_CPU_PLUGIN_VERSION) ./sdk-python
	cd $(BUILD) && COLOCATED_NUM_CPU_DEVICES=2 $(BENCH_VENV)/bin/python $(CURDIR)/sdk-python/bench/bench_colocated.py
	cd $(BUILD) && $(BENCH_VENV)/bin/python $(CURDIR)/sdk-python/bench/bench_xla.py
	cd $(BUILD) && $(BENCH_VENV)/bin/python $(CURDIR)/sdk-python/bench/bench_remote.py

# The Node SDK's figures, on a release build of the addon and the worker.
bench-node: $(NODE_DEPS) $(PLUGIN)
	$(CARGO) build --release -p colocated-cli
	cd $(NODE_DIR) && $(NODE_BIN)/napi build --platform --release --js binding.js --dts binding.d.ts
	COLOCATED_WORKER_BIN=$(TARGET_DIR)/release/colocated COLOCATED_PLUGIN=$(PLUGIN) node $(NODE_DIR)/bench/bench.mjs

fuzz-tools: $(CARGO_FUZZ)

$(CARGO_FUZZ):
	@echo "make: installing cargo-fuzz $(CARGO_FUZZ_VERSION) into $(TOOLS) (cargo install)"
	env -u CARGO_TARGET_DIR $(CARGO) install cargo-fuzz --locked --quiet --version $(CARGO_FUZZ_VERSION) --root $(TOOLS)

# libFuzzer without a sanitizer (`-s none`), which the stable toolchain builds.
# The fuzz crate keeps its own target dir (fuzz/target); inputs that find new
# paths go to fuzz/corpus/, failing ones to fuzz/artifacts/ (and fail the run).
fuzz: fuzz-tools
	env -u CARGO_TARGET_DIR $(CARGO_FUZZ) fuzz build -s none
	@passed=0; failed=0; \
	for t in $(FUZZ_TARGETS); do \
	  mkdir -p fuzz/corpus/$$t; \
	  echo "== fuzz $$t ($(FUZZ_SECONDS) s)"; \
	  if env -u CARGO_TARGET_DIR $(CARGO_FUZZ) fuzz run -s none $$t fuzz/corpus/$$t fuzz/seeds/$$t -- \
	      -max_total_time=$(FUZZ_SECONDS) -timeout=10 -print_final_stats=1; \
	  then passed=$$((passed + 1)); else failed=$$((failed + 1)); fi; \
	done; \
	echo "fuzz: $$passed passed, $$failed failed"; \
	test $$failed -eq 0

# bindgen (for pjrt/src/sys.rs), built from crates.io into build/tools; it
# needs libclang (Debian: libclang-dev).
$(BINDGEN):
	@echo "make: installing bindgen-cli $(BINDGEN_VERSION) into $(TOOLS) (cargo install; needs libclang, Debian's libclang-dev)"
	env -u CARGO_TARGET_DIR $(CARGO) install bindgen-cli --locked --quiet --version $(BINDGEN_VERSION) --root $(TOOLS)

PJRT_BINDGEN = $(BINDGEN) third_party/pjrt/pjrt_c_api.h --allowlist-item 'PJRT_.*' \
  --no-doc-comments --no-prepend-enum-name \
  --raw-line '// Generated from third_party/pjrt/pjrt_c_api.h by bindgen $(BINDGEN_VERSION) (`make pjrt-bindings`); do not edit.'

# The Rust declarations of the vendored PJRT C API header, checked in.
pjrt-bindings: $(BINDGEN)
	$(PJRT_BINDGEN) -o pjrt/src/sys.rs -- -x c

# Fails when pjrt/src/sys.rs is not what bindgen makes of the header.
check-pjrt-bindings: $(BINDGEN) | $(BUILD)
	$(PJRT_BINDGEN) -o $(BUILD)/pjrt_sys.rs -- -x c
	@cmp -s pjrt/src/sys.rs $(BUILD)/pjrt_sys.rs || { \
	  echo "pjrt/src/sys.rs differs from bindgen's output for third_party/pjrt/pjrt_c_api.h: run make pjrt-bindings"; \
	  diff pjrt/src/sys.rs $(BUILD)/pjrt_sys.rs | head -n 20; exit 1; }

lint: $(NODE_DEPS) $(VENV_STAMP) check-pjrt-bindings
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings
	$(VENV)/bin/ruff check tests examples sdk-python
	cd $(NODE_DIR) && $(NODE_BIN)/biome check . ../examples/demo.mjs

clean:
	$(CARGO) clean
	rm -rf $(BUILD)
