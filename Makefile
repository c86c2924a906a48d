# Two commands do everything on a fresh machine: `make quickstart` and `make test` (see README.md).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# On a CPU-only machine this installs the CPU build of torch before anything else asks for torch, so
# pip never resolves `torch>=2.11` to a multi-GB CUDA build: `torch==X+cpu` from pip's configured sources
# (a local wheel, where there is one), else from PyTorch's CPU index; macOS has no `+cpu` builds, and its
# plain build is the CPU one. GPU users bring their own torch: `make TORCH_SPEC= test` keeps whatever torch
# the venv already has (e.g. one made with `python3 -m venv --system-site-packages .venv`).
TORCH_VERSION   ?= 2.13.0
TORCH_SPEC      ?= torch==$(TORCH_VERSION)+cpu
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
PYTEST_ARGS ?=

.PHONY: quickstart test install install-dev cuda clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.torch: | $(BIN)/python
	@if [ -n "$(TORCH_SPEC)" ] && ! $(BIN)/python -c "import torch" 2>/dev/null; then \
		echo "installing $(TORCH_SPEC)"; \
		$(BIN)/python -m pip install -q "$(TORCH_SPEC)" 2>/dev/null \
		|| $(BIN)/python -m pip install -q --index-url $(TORCH_CPU_INDEX) "$(TORCH_SPEC)" \
		|| { [ "$$(uname)" = Darwin ] && $(BIN)/python -m pip install -q "$(subst +cpu,,$(TORCH_SPEC))"; }; fi
	@touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(BIN)/python -m pip install -q -e .
	@touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.torch
	$(BIN)/python -m pip install -q -e ".[dev]"
	@touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# The quickstart's S3 step runs a local moto server, a dev dependency.
quickstart: $(VENV)/.installed-dev
	$(BIN)/python scripts/quickstart.py

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -n 2 --durations=25 $(PYTEST_ARGS)

# Builds cuda/ into cuda/build/libmarin_kernels.so for sm_90 and sm_100 (plus PTX); needs nvcc, not a GPU.
cuda: $(VENV)/.installed
	$(BIN)/python -m marin_model.cuda --build

clean:
	rm -rf $(VENV) cuda/build out .pytest_cache
