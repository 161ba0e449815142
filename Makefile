# fused_ops: the two commands a newcomer needs are `make test` and `make bench`.
# Each sets up what it needs (torch 2.11.0 if no torch is installed, build tools, pytest),
# builds the extension in place (CUDA kernels when a toolkit is found) and runs.
PYTHON ?= python3
TORCH_VERSION ?= 2.11.0
JOBS ?= $(shell nproc)
# The linters are pinned: another version formats differently and would fail `make lint`.
RUFF_VERSION ?= 0.17.6
CLANG_FORMAT_VERSION ?= 14.0.6
# The optional extra fused_ops[hf] (setup.py's HF_REQUIREMENT): tests/test_patch.py and the
# end-to-end benchmark need it.
TRANSFORMERS_SPEC ?= transformers>=5.24,<6
PY_SCRIPTS := $(shell $(PYTHON) -c "import sysconfig; print(sysconfig.get_path('scripts'))")
CLANG_FORMAT ?= $(or $(wildcard $(PY_SCRIPTS)/clang-format),clang-format)
CSRC := $(shell find csrc -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' | sort)

.PHONY: setup build test bench profile gpu-check lint format clean

# setup installs into $(PYTHON) (the first python3 on PATH unless PYTHON=... says otherwise):
# it says which interpreter that is, and what it installs and how big it is, before it does.
setup:
	@$(PYTHON) -c "import sys; v = sys.prefix != sys.base_prefix; print(f'make: using {sys.executable}' + ('' if v else ' (not a virtual environment: packages go into this Python itself; PYTHON=... picks another)'))"
	@$(PYTHON) -c "import torch" 2>/dev/null || { \
	  echo "make: no torch in $(PYTHON): installing torch==$(TORCH_VERSION) with its CUDA libraries (about 4.8 GB to download; a few minutes)"; \
	  $(PYTHON) -m pip install -q torch==$(TORCH_VERSION); }
	@missing=$$($(PYTHON) -c "import importlib.util as u; print(' '.join(p for p, m in [('numpy', 'numpy'), ('pytest', 'pytest'), ('ninja', 'ninja'), ('setuptools', 'setuptools'), ('wheel', 'wheel'), ('expecttest', 'expecttest'), ('matplotlib', 'matplotlib'), ('ruff==$(RUFF_VERSION)', 'ruff'), ('clang-format==$(CLANG_FORMAT_VERSION)', 'clang_format'), ('$(TRANSFORMERS_SPEC)', 'transformers')] if u.find_spec(m) is None))"); \
	if [ -n "$$missing" ]; then echo "make: installing into $(PYTHON): $$missing"; \
	  $(PYTHON) -m pip install -q --disable-pip-version-check $$missing; fi

build: setup
	@$(PYTHON) -c "import os; from torch.utils.cpp_extension import CUDA_HOME; flag = os.environ.get('FUSED_OPS_CUDA'); cuda = flag == '1' if flag else CUDA_HOME is not None; print('make: building fused_ops in place with $(JOBS) jobs: ' + ('CPU and CUDA kernels (about 9 minutes on 2 cores, 2 on 16; FUSED_OPS_CUDA=0 builds the CPU kernels only, about a minute)' if cuda else 'CPU kernels only, about a minute (' + ('FUSED_OPS_CUDA=0' if flag else 'no CUDA toolkit found') + ')'))" 2>/dev/null
	MAX_JOBS=$(JOBS) $(PYTHON) setup.py -q build_ext --inplace

# The tests first (a style slip should not hide a failing test), then the style checks.
test: build
	$(PYTHON) -m pytest -q tests
	$(MAKE) --no-print-directory lint

# Style checks, no changes: ruff (pyproject.toml's [tool.ruff]) and clang-format (.clang-format).
lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(CLANG_FORMAT) --dry-run -Werror $(CSRC)

# Rewrites the tree to the style `make lint` checks.
format:
	$(PYTHON) -m ruff check --fix .
	$(PYTHON) -m ruff format .
	$(CLANG_FORMAT) -i $(CSRC)

# The kernel suite, then the end-to-end training steps (benchmarks/e2e.py, minutes; --quick
# in BENCH_ARGS makes both quick, E2E_ARGS adds the e2e benchmark's own options, E2E=0 skips it).
E2E ?= 1
bench: build
	$(PYTHON) benchmarks/run.py $(BENCH_ARGS)
	$(if $(filter 1,$(E2E)),$(PYTHON) benchmarks/e2e.py $(filter --quick,$(BENCH_ARGS)) $(E2E_ARGS))

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
