# colocated — build, demo, test, bench, lint.
#   make demo   builds everything and runs the demo
#   make test   runs every test
#   make python builds the Python SDK into build/venv (make test-python tests it)
#   make node   builds the Node SDK in sdk-node (make test-node tests it)
#   make fuzz   runs each fuzz target (fuzz/) for FUZZ_SECONDS
CARGO ?= cargo
CC ?= cc
PYTHON ?= python3
TARGET_DIR := $(CURDIR)/target
DEBUG_DIR := $(TARGET_DIR)/debug
BUILD := $(CURDIR)/build
CBINDGEN_VERSION := 0.29.4
CARGO_FUZZ_VERSION := 0.13.2
FUZZ_TARGETS := executable_format control_messages buffer_chunks router_requests colocated_protocol
FUZZ_SECONDS ?= 20
export CARGO_TARGET_DIR := $(TARGET_DIR)
VENV := $(BUILD)/venv
VENV_PY := $(VENV)/bin/python
PY_DEPS := maturin numpy optree ml_dtypes cloudpickle pytest tqdm absl-py pyyaml kubernetes-validate ray
NODE_DIR := $(CURDIR)/sdk-node
NODE_BIN := $(NODE_DIR)/node_modules/.bin
NODE_DEPS := $(NODE_DIR)/node_modules/.package-lock.json
PLUGIN := $(BUILD)/libadd_one_plugin.so

CFLAGS_COMMON := -std=c11 -Wall -Wextra -Wno-missing-field-initializers -Werror -Iinclude
LDLIBS := -lpthread -ldl -lm

PHONY_EXTRA := bench-rust bench-python bench-node fuzz fuzz-tools node test-node check-node-binding
.PHONY: all build demo test test-rust test-c test-abi test-python python $(PHONY_EXTRA) check-header header abi-manifest bench lint tools clean

all: build

build:
	$(CARGO) build --workspace

tools:
	@command -v cbindgen >/dev/null 2>&1 && cbindgen --version | grep -q $(CBINDGEN_VERSION) || \
	  $(CARGO) install cbindgen --locked --version $(CBINDGEN_VERSION)

$(BUILD):
	mkdir -p $(BUILD)

demo: build python node $(PLUGIN) | $(BUILD)
	$(CC) $(CFLAGS_COMMON) examples/demo.c -o $(BUILD)/demo -L$(DEBUG_DIR) -lcolocated -Wl,-rpath,$(DEBUG_DIR) $(LDLIBS)
	$(BUILD)/demo
	@echo
	COLOCATED_NUM_CPU_DEVICES=4 $(VENV_PY) examples/demo.py
	@echo
	$(VENV_PY) examples/cluster_demo.py
	@echo
	COLOCATED_PLUGIN=$(PLUGIN) node examples/demo.mjs

# The example plugin (the tests' `plugin_add_one_i32` and `plugin_fail`).
$(PLUGIN): tests/plugin/add_one_plugin.c include/colocated.h | $(BUILD)
	$(CC) -std=c11 -shared -fPIC -Iinclude $< -o $@

# The Node SDK's npm packages, exactly as the committed lock file says.
$(NODE_DEPS): $(NODE_DIR)/package-lock.json
	cd $(NODE_DIR) && npm ci --no-audit --no-fund

# The Node addon (debug) and its generated binding (binding.js, binding.d.ts).
node: $(NODE_DEPS)
	cd $(NODE_DIR) && $(NODE_BIN)/napi build --platform --js binding.js --dts binding.d.ts

# The committed binding files must be what the Rust crate generates, as the
# C header must be what cbindgen generates.
check-node-binding: node
	@git diff --exit-code -- sdk-node/binding.js sdk-node/binding.d.ts || \
	  (echo "sdk-node/binding.js or binding.d.ts is stale: run 'make node' and commit them" && exit 1)

# Real worker processes (the `colocated` executable, and Python workers of
# the Python SDK for the cross-language test) on 127.0.0.1, and the types as a
# TypeScript user sees them.
test-node: node python
	$(CARGO) build -p colocated-cli
	cd $(NODE_DIR) && $(NODE_BIN)/tsc -p tsconfig.json
	cd $(NODE_DIR) && rm -rf tests/ts-out && $(NODE_BIN)/tsc -p tsconfig.decorators.json
	cd $(NODE_DIR) && COLOCATED_PYTHON=$(VENV_PY) node --test --test-concurrency=1 tests/

header: tools
	cd ffi && cbindgen --config cbindgen.toml --crate colocated-ffi --quiet --output ../include/colocated.h

check-header: tools | $(BUILD)
	cd ffi && cbindgen --config cbindgen.toml --crate colocated-ffi --quiet --output $(BUILD)/colocated.h
	@diff -u include/colocated.h $(BUILD)/colocated.h || \
	  (echo "include/colocated.h is stale: run 'make header' and commit it" && exit 1)

test: check-header test-rust test-c test-abi test-python check-node-binding test-node

test-rust:
	$(CARGO) test --workspace

# Without the mimalloc feature, so LeakSanitizer sees every allocation.
test-c: | $(BUILD)
	$(CARGO) build -p colocated-ffi --no-default-features
	$(MAKE) -C tests/c run LIBDIR=$(DEBUG_DIR) BUILD=$(BUILD)/c

test-abi: build | $(BUILD)
	$(PYTHON) tests/abi/abi_manifest.py check --header include/colocated.h --lib $(DEBUG_DIR)/libcolocated.so --manifest tests/abi/manifest.json --build $(BUILD)/abi
	$(MAKE) -C tests/abi run LIBDIR=$(DEBUG_DIR) BUILD=$(BUILD)/abi

abi-manifest: build | $(BUILD)
	$(PYTHON) tests/abi/abi_manifest.py generate --header include/colocated.h --lib $(DEBUG_DIR)/libcolocated.so --manifest tests/abi/manifest.json --build $(BUILD)/abi

$(VENV_PY): | $(BUILD)
	$(PYTHON) -m venv $(VENV)
	$(VENV_PY) -m pip install --quiet --disable-pip-version-check $(PY_DEPS)

# An editable debug build of sdk-python into the venv, sharing target/ (maturin
# develop: no wheel round trip and no release build).
python: $(VENV_PY)
	VIRTUAL_ENV=$(VENV) $(VENV)/bin/maturin develop --quiet --features testing -m sdk-python/Cargo.toml

test-python: python
	$(VENV_PY) -m pytest sdk-python/tests -q

BENCH_VENV := $(BUILD)/bench-venv

bench: bench-rust bench-python bench-node

bench-rust:
	$(CARGO) bench --workspace

# A release build of the SDK beside its baselines: jax[cpu] for local calls, Ray
# (and raw TCP) for calls to a worker process.
bench-python: | $(BUILD)
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --disable-pip-version-check "jax[cpu]" ray pytest ./sdk-python
	cd $(BUILD) && COLOCATED_NUM_CPU_DEVICES=2 $(BENCH_VENV)/bin/python $(CURDIR)/sdk-python/bench/bench_colocated.py
	cd $(BUILD) && $(BENCH_VENV)/bin/python $(CURDIR)/sdk-python/bench/bench_remote.py

# The Node SDK's figures, on a release build of the addon and the worker.
bench-node: $(NODE_DEPS) $(PLUGIN)
	$(CARGO) build --release -p colocated-cli
	cd $(NODE_DIR) && $(NODE_BIN)/napi build --platform --release --js binding.js --dts binding.d.ts
	COLOCATED_WORKER_BIN=$(TARGET_DIR)/release/colocated COLOCATED_PLUGIN=$(PLUGIN) node $(NODE_DIR)/bench/bench.mjs

fuzz-tools:
	@command -v cargo-fuzz >/dev/null 2>&1 && cargo-fuzz --version | grep -q " $(CARGO_FUZZ_VERSION)$$" || \
	  $(CARGO) install cargo-fuzz --locked --version $(CARGO_FUZZ_VERSION)

# libFuzzer without a sanitizer (`-s none`), which the stable toolchain builds.
# The fuzz crate keeps its own target dir (fuzz/target); inputs that find new
# paths go to fuzz/corpus/, failing ones to fuzz/artifacts/ (and fail the run).
fuzz: fuzz-tools
	env -u CARGO_TARGET_DIR $(CARGO) fuzz build -s none
	@passed=0; failed=0; \
	for t in $(FUZZ_TARGETS); do \
	  mkdir -p fuzz/corpus/$$t; \
	  echo "== fuzz $$t ($(FUZZ_SECONDS) s)"; \
	  if env -u CARGO_TARGET_DIR $(CARGO) fuzz run -s none $$t fuzz/corpus/$$t fuzz/seeds/$$t -- \
	      -max_total_time=$(FUZZ_SECONDS) -timeout=10 -print_final_stats=1; \
	  then passed=$$((passed + 1)); else failed=$$((failed + 1)); fi; \
	done; \
	echo "fuzz: $$passed passed, $$failed failed"; \
	test $$failed -eq 0

lint: $(NODE_DEPS)
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings
	ruff check tests examples sdk-python
	cd $(NODE_DIR) && $(NODE_BIN)/biome check . ../examples/demo.mjs

clean:
	$(CARGO) clean
	rm -rf $(BUILD)
