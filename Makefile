# One entry point that mirrors CI. `make demo` is the main job; `make check` runs every test.
SHELL := /bin/bash
PYTHON ?= python3
CARGO ?= cargo

.PHONY: demo check deps build install fmt clippy test-rust test-doc test-python bench-harness bench-harness-render

demo:
	$(CARGO) build --release
	./target/release/insitubatch demo

deps:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements-test.txt

build:
	$(CARGO) build --release

# The C library, insitubatch.h, insitubatch.hpp and a pkg-config file under PREFIX, for C and C++
# programs built outside this tree (docs/c-api.md, "Installing").
PREFIX ?= /usr/local
install: build
	bindings/c/install.sh "$(PREFIX)"

fmt:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# The Rust suites run twice: once forced onto io_uring (when this kernel allows it), once forced
# onto the blocking-thread fallback.
test-rust:
	@if $(CARGO) nextest --version >/dev/null 2>&1; then runner="$(CARGO) nextest run --workspace --no-fail-fast"; \
	 else runner="$(CARGO) test --workspace --no-fail-fast"; fi; \
	 set -e; \
	 if [ "$$(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null || echo 0)" = "0" ]; then \
	   echo "== Rust tests, INSITUBATCH_IO=uring"; INSITUBATCH_IO=uring $$runner; \
	 else echo "== io_uring disabled by sysctl on this machine: skipping the forced-uring run"; fi; \
	 echo "== Rust tests, INSITUBATCH_IO=threads"; INSITUBATCH_IO=threads $$runner

test-doc:
	$(CARGO) test --workspace --doc
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps

# The Python shim against the library `build` produced, without installing it; the C example and
# the C ABI checks run inside test-rust (tests/tests/c_abi.rs).
test-python:
	PYTHONPATH=bindings/python INSITUBATCH_LIB=$(CURDIR)/target/release/libinsitubatch.so \
	  $(PYTHON) -m pytest -q bindings/python/tests bench-harness/test_smoke.py

check: deps fmt build clippy test-rust test-doc test-python
	@echo "make check: all checks passed"

# The full side-by-side benchmark (minutes): results, the table and the plot into docs/harness/.
# It installs what it measures (torch, zarr-python, xbatcher, ...) first, as `check` does.
bench-harness: deps build
	rm -f docs/harness/results.jsonl
	mkdir -p docs/harness
	$(PYTHON) bench-harness/run.py --out docs/harness/results.jsonl \
	  --markdown docs/harness/table.md --plots docs/harness --docs docs/benchmarks.md
	rm -f docs/harness/variants.jsonl
	$(PYTHON) bench-harness/run.py --variants fat-spatial,v2-blosc,sharded \
	  --out docs/harness/variants.jsonl --markdown docs/harness/variants.md --docs docs/benchmarks.md
	rm -f docs/harness/train_step.jsonl
	$(PYTHON) bench-harness/run.py --train-step --accelerator-ms 10 --spc 1,8,32 --no-inference \
	  --out docs/harness/train_step.jsonl --markdown docs/harness/train_step.md \
	  --docs docs/benchmarks.md --docs-region train-step

# The tables, the plots and the docs regions again from the saved rows (measures nothing).
bench-harness-render: deps
	$(PYTHON) bench-harness/run.py --from docs/harness/results.jsonl \
	  --markdown docs/harness/table.md --plots docs/harness --docs docs/benchmarks.md
	$(PYTHON) bench-harness/run.py --variants fat-spatial,v2-blosc,sharded \
	  --from docs/harness/variants.jsonl --markdown docs/harness/variants.md --docs docs/benchmarks.md
	$(PYTHON) bench-harness/run.py --from docs/harness/train_step.jsonl \
	  --markdown docs/harness/train_step.md --docs docs/benchmarks.md --docs-region train-step
