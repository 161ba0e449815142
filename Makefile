# fused_ops: the two commands a newcomer needs are `make test` and `make bench`.
# Each sets up what it needs (torch 2.11.0 if no torch is installed, build tools, pytest),
# builds the extension in place (CUDA kernels when a toolkit is found) and runs.
PYTHON ?= python3
TORCH_VERSION ?= 2.11.0
JOBS ?= $(shell nproc)

.PHONY: setup build test bench profile gpu-check clean

setup:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install -q torch==$(TORCH_VERSION)
	@$(PYTHON) -m pip install -q --disable-pip-version-check numpy pytest ninja setuptools wheel expecttest matplotlib

build: setup
	MAX_JOBS=$(JOBS) $(PYTHON) setup.py -q build_ext --inplace

test: build
	$(PYTHON) -m pytest -q tests

bench: build
	$(PYTHON) benchmarks/run.py $(BENCH_ARGS)

profile: build
	$(PYTHON) profiling/trace.py $(PROFILE_ARGS)

# On a GPU machine with torch preinstalled: build with all cores, run the GPU tests and a
# quick benchmark. OUT (a folder) receives the logs and results when set.
gpu-check:
	MAX_JOBS=$(JOBS) $(PYTHON) setup.py -q build_ext --inplace
	$(PYTHON) -m pytest -q tests/test_harness.py
	$(PYTHON) tests/run_parallel.py -m cuda
	$(PYTHON) benchmarks/run.py --quick $(BENCH_ARGS)

clean:
	rm -rf build fused_ops/_C*.so fused_ops/_build_info.py
