# Every target bootstraps .venv on its own. TORCH_SPEC picks the torch install:
# the default takes the CPU build present on CPU-only machines and never pulls a CUDA build.
PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
EXTRAS     ?= test,xla,bench
PY         := $(VENV)/bin/python
STAMP      := $(VENV)/.fusedops-installed
PYTEST_ARGS ?=

.PHONY: test demo lint format bench kernel-report install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first, pinned: later installs see it satisfied and never fetch another build.
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) -m fusedops demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

# Triton and CUDA kernels compiled for sm_90/sm_80 without a GPU: registers, spills, occupancy.
kernel-report: $(STAMP)
	$(PY) benchmarks/kernel_report.py

clean:
	rm -rf $(VENV) build dist *.egg-info
