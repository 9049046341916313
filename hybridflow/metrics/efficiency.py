"""Each phase of a step against the machine's limit: model FLOP/s as a fraction of the measured matmul
peak (the update and the log-prob forwards), and bytes read per second as a fraction of the measured
memory bandwidth (decoding).

FLOPs (Kaplan et al., arXiv:2001.08361, section 2.1; the MFU of Chowdhery et al., arXiv:2204.02311,
appendix B): a forward costs 2 FLOPs per matmul parameter per token and a backward twice that, so a
training pass costs ``6 N`` per token, where ``N`` counts the parameters of the matmuls (each layer's
q/k/v/o and MLP projections and the LM head; an embedding lookup costs none). Attention adds, per
layer, ``2 q_dim`` FLOPs per (query, key) pair for the scores and as many for the weighted sum. A causal
sequence of ``s`` tokens has ``s (s + 1) / 2`` such pairs, so its forward adds ``2 L q_dim s (s + 1)``
and a training pass 3x that. The count is of the causal pairs, the useful work, not the full ``s^2``
of the PaLM formula: figures for long sequences sit below PaLM-style ones. Where the forwards run each
prompt once for all its samples (shared-prefix forwards, the CPU default), a prompt is counted once.
With LoRA the frozen base weights get no weight gradient: an update costs ``4 N`` per token for them and
``6`` per adapter parameter (`training_flops`).

Decoding is bound by memory: every decode step reads all weights once, whatever the batch, and each
sequence reads its keys and values up to its position. Bytes of a generation =
``steps * weight_bytes + sum over decoded tokens of 2 L kv_dim context bytes_per_value``, where all rows
of an engine decode together, so the longest response sets the step count (an estimate: an engine that
splits its rows into waves takes more steps). The prompt's prefill is compute-bound and not counted.

The peak is measured once per machine (`measure_machine_peak`, ``python benchmarks/bench_machine_peak.py``)
and stored by device name (`save_machine_peak`); a run reports the fractions when its device has one.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from hybridflow.planning.model_shape import ModelShape, count_parameters

__all__ = [
    "DEFAULT_PEAK_FILE",
    "MachinePeak",
    "decode_bytes",
    "device_name",
    "forward_flops",
    "fractions_above_peak",
    "load_machine_peak",
    "matmul_parameters",
    "measure_machine_peak",
    "phase_efficiency",
    "repeated_prompts",
    "save_machine_peak",
    "training_flops",
]

DEFAULT_PEAK_FILE = "~/.cache/hybridflow/machine_peak.json"
"""Where `save_machine_peak` keeps the measured peaks, one entry per device name."""

BYTES_PER_VALUE = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class MachinePeak:
    """What one device can do at most, measured (`measure_machine_peak`).

    Attributes:
        device: the device's name (`device_name`): a GPU's model, or a CPU's model and core count.
        matmul_flops: achieved FLOP/s of a large square matmul, by dtype name (``float32``, ``bfloat16``).
        copy_bytes_per_s: bytes read plus bytes written per second by a streaming copy of a large buffer.
    """

    device: str
    matmul_flops: dict[str, float]
    copy_bytes_per_s: float


def matmul_parameters(shape: ModelShape) -> int:
    """Parameters that take part in a matmul per token: each layer's q, k, v, o and gated-MLP
    projections, and the LM head (also when tied to the embedding). Biases and norms are left out."""
    kv_dim = shape.num_kv_heads * shape.head_dim
    attention = shape.hidden_size * (2 * shape.q_dim + 2 * kv_dim)
    mlp = 3 * shape.hidden_size * shape.intermediate_size
    return shape.num_layers * (attention + mlp) + shape.hidden_size * shape.vocab_size


def _tokens_and_pairs(
    prompt_lengths: Tensor, response_lengths: Tensor, repeated_prompt: Tensor | None
) -> tuple[float, float]:
    """Tokens a forward runs and their causal (query, key) pairs, each shared prompt counted once."""
    prompts, responses = prompt_lengths.double(), response_lengths.double()
    own = torch.ones_like(prompts) if repeated_prompt is None else (~repeated_prompt).double()
    tokens = (own * prompts + responses).sum().item()
    # pairs of a sequence of s = p + r tokens, s (s + 1) / 2, split into the prompt's and the response's
    pairs = (own * prompts * (prompts + 1) / 2 + responses * prompts + responses * (responses + 1) / 2).sum().item()
    return tokens, pairs


def forward_flops(
    shape: ModelShape,
    prompt_lengths: Tensor,
    response_lengths: Tensor,
    repeated_prompt: Tensor | None = None,
    adapter_parameters: int = 0,
) -> float:
    """Model FLOPs of one forward over rows of ``prompt_lengths [rows]`` + ``response_lengths [rows]``
    tokens: ``2 N`` per token plus ``4 L q_dim`` per causal (query, key) pair (module docstring), where
    ``N`` adds the ``adapter_parameters`` of LoRA adapters (each a matmul of its own) to the model's.

    ``repeated_prompt [rows]`` (bool) marks rows whose prompt the forward already ran for another row of
    the same prompt (shared-prefix forwards, `hybridflow.parallel.shared_prefix`): their prompt tokens
    and the prompt's own pairs are not counted again, only their response's tokens and pairs.
    """
    tokens, pairs = _tokens_and_pairs(prompt_lengths, response_lengths, repeated_prompt)
    matmul = matmul_parameters(shape) + adapter_parameters
    return 2.0 * matmul * tokens + 4.0 * shape.num_layers * shape.q_dim * pairs


def training_flops(
    shape: ModelShape,
    prompt_lengths: Tensor,
    response_lengths: Tensor,
    repeated_prompt: Tensor | None = None,
    adapter_parameters: int = 0,
) -> float:
    """Model FLOPs of a forward and backward over the same rows.

    Full fine-tuning (``adapter_parameters=0``): 3x `forward_flops`, the backward computing each
    matmul's input gradient and its weight gradient. With LoRA the base weights are frozen, so their
    weight gradients are not computed: ``4 N`` per token for the base, ``6`` per token for each of the
    ``adapter_parameters``, and 3x the forward's attention (its backward has no weights to skip).
    """
    if adapter_parameters == 0:
        return 3.0 * forward_flops(shape, prompt_lengths, response_lengths, repeated_prompt)
    tokens, pairs = _tokens_and_pairs(prompt_lengths, response_lengths, repeated_prompt)
    matmul = 4.0 * matmul_parameters(shape) + 6.0 * adapter_parameters
    return matmul * tokens + 3.0 * 4.0 * shape.num_layers * shape.q_dim * pairs


def repeated_prompts(input_ids: Tensor) -> Tensor:
    """``[rows]`` bool: True on each row whose prompt ``input_ids [rows, prompt_len]`` (padding
    included: the same prompt is padded alike) appeared on an earlier row."""
    seen: set[tuple[int, ...]] = set()
    repeated = []
    for prompt in map(tuple, input_ids.tolist()):
        repeated.append(prompt in seen)
        seen.add(prompt)
    return torch.tensor(repeated, dtype=torch.bool)


def decode_bytes(
    shape: ModelShape, prompt_lengths: Tensor, response_lengths: Tensor, dtype: str, engines: int = 1
) -> float:
    """Bytes read to decode ``response_lengths [rows]`` tokens after ``prompt_lengths [rows]``.

    ``engines`` engines each read all weights once per decode step, for as many steps as the longest
    response; each decoded token at position ``p`` of its response reads the keys and values of its
    ``prompt + p`` earlier tokens in every layer (module docstring).
    """
    width = BYTES_PER_VALUE[dtype]
    if response_lengths.numel() == 0:
        return 0.0
    steps = int(response_lengths.max())
    weights = engines * steps * count_parameters(shape) * width
    prompts, responses = prompt_lengths.double(), response_lengths.double()
    # sum over p = 0 .. r-1 of (prompt + p) = r * prompt + r (r - 1) / 2
    contexts = (responses * prompts + responses * (responses - 1) / 2).sum().item()
    per_context_token = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * width
    return float(weights) + contexts * per_context_token


def _best_seconds(fn: Callable[[], object], repeats: int, budget_s: float) -> float:
    """The best of up to ``repeats`` timed runs of ``fn``; the first run is a warm-up (allocation, kernel
    selection, thread start) unless it alone took ``budget_s``, and no run starts after ``budget_s``."""
    start = time.perf_counter()
    best = _timed(fn)
    if best >= budget_s:
        return best
    best = float("inf")
    for _ in range(repeats):
        best = min(best, _timed(fn))
        if time.perf_counter() - start >= budget_s:
            break
    return best


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure_machine_peak(
    device: str = "cpu",
    matmul_size: int = 2048,
    copy_mib: int = 512,
    repeats: int = 5,
    dtypes: tuple[str, ...] = ("float32", "bfloat16"),
    budget_s: float = 20.0,
) -> MachinePeak:
    """Time a ``matmul_size``-square matmul in each of ``dtypes``, and a copy of ``copy_mib`` MiB, on
    ``device``; the best of ``repeats`` runs each after a warm-up, within ``budget_s`` seconds each (a
    CPU without bf16 units runs a bf16 matmul a hundred times slower than fp32).

    A square matmul costs ``2 n^3`` FLOPs; a copy reads and writes its buffer once each.
    """
    flops: dict[str, float] = {}
    for dtype in dtypes:
        a = torch.randn(matmul_size, matmul_size, device=device).to(getattr(torch, dtype))
        b = torch.randn(matmul_size, matmul_size, device=device).to(getattr(torch, dtype))
        flops[dtype] = 2.0 * matmul_size**3 / _best_seconds(lambda a=a, b=b: a @ b, repeats, budget_s)
    source = torch.ones(copy_mib * 2**20 // 4, device=device)
    target = torch.empty_like(source)
    seconds = _best_seconds(lambda: target.copy_(source), repeats, budget_s)
    return MachinePeak(device_name(device), flops, 2.0 * source.numel() * 4 / seconds)


def device_name(device: str = "cpu") -> str:
    """The name a measured peak is stored under: a GPU's model, or the CPU's model and the number of
    cores this process may run on, since the peak scales with them."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model} x{len(os.sched_getaffinity(0))}"


def save_machine_peak(peak: MachinePeak, path: str = DEFAULT_PEAK_FILE) -> Path:
    """Store ``peak`` under its device name in the JSON file ``path`` (other devices' entries kept)."""
    file = Path(os.path.expanduser(path))
    entries = json.loads(file.read_text()) if file.exists() else {}
    entries[peak.device] = asdict(peak)
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n")
    return file


def load_machine_peak(device: str, path: str = DEFAULT_PEAK_FILE) -> MachinePeak | None:
    """The peak stored for ``device`` (a `device_name`) in ``path``, or ``None`` when there is none.

    Raises:
        ValueError: naming ``path`` when it is not a peak file `save_machine_peak` wrote.
    """
    file = Path(os.path.expanduser(path))
    if not file.exists():
        return None
    try:
        entry = json.loads(file.read_text()).get(device)
        return None if entry is None else MachinePeak(**entry)
    except (json.JSONDecodeError, TypeError, AttributeError) as error:
        raise ValueError(
            f"{file} is not a machine-peak file (benchmarks/bench_machine_peak.py writes one): {error}"
        ) from error


def phase_efficiency(
    shape: ModelShape,
    peak: MachinePeak,
    seconds: Mapping[str, float],
    *,
    prompt_lengths: Tensor,
    response_lengths: Tensor,
    updated_rows: Tensor,
    update_passes: int,
    compute_dtype: str,
    engine_dtype: str,
    engines: int,
    prompt_ids: Tensor | None = None,
    adapter_parameters: int = 0,
) -> dict[str, float]:
    """Each timed phase's model FLOP/s (or bytes/s) and its fraction of ``peak``.

    Args:
        shape: the policy's shape.
        peak: the machine's measured peak (the whole machine: every rank's work counts).
        seconds: phase name -> seconds (`hybridflow.metrics.timing.PhaseTimer.seconds`); the phases
            ``update``, ``log_prob``, ``ref`` and ``generation`` are read when present.
        prompt_lengths, response_lengths: ``[rows]`` valid tokens of each row's prompt and response.
        updated_rows: ``[rows]`` bool, the rows the update trained on (it may skip rows without advantage).
        update_passes: passes of the update over its rows (``actor.ppo_epochs``).
        compute_dtype: the training layout's compute dtype (the matmul peak it is held against).
        engine_dtype: the rollout engine's weight and KV dtype.
        engines: rollout engines decoding at once.
        prompt_ids: ``[rows, prompt_len]``, each row's prompt ids, when the training layout's forwards
            run each prompt once for all its rows (shared-prefix forwards); ``None`` counts every row's.
        adapter_parameters: the actor's LoRA adapter parameters (0: full fine-tuning); the update then
            computes no weight gradient of the frozen base (`training_flops`).

    Returns:
        ``perf/<phase>_flops_per_s`` and ``perf/mfu_<phase>`` for ``update``, ``log_prob`` and ``ref``;
        ``perf/generation_bytes_per_s`` and ``perf/generation_bandwidth_frac`` for ``generation``.
    """
    # A peak file measured without this dtype still gives the rates, only not their fractions.
    matmul_peak = peak.matmul_flops.get(compute_dtype)
    every = torch.ones_like(updated_rows)

    def counted(rows: Tensor, count: Callable[..., float]) -> float:
        repeated = None if prompt_ids is None else repeated_prompts(prompt_ids[rows])
        return count(shape, prompt_lengths[rows], response_lengths[rows], repeated, adapter_parameters)

    work = {
        "update": update_passes * counted(updated_rows, training_flops),
        "log_prob": counted(every, forward_flops),
    }
    work["ref"] = work["log_prob"]
    out: dict[str, float] = {}
    for phase, flops in work.items():
        if seconds.get(phase, 0.0) > 0:
            rate = flops / seconds[phase]
            out[f"perf/{phase}_flops_per_s"] = rate
            if matmul_peak:
                out[f"perf/mfu_{phase}"] = rate / matmul_peak
    if seconds.get("generation", 0.0) > 0:
        rate = decode_bytes(shape, prompt_lengths, response_lengths, engine_dtype, engines) / seconds["generation"]
        out["perf/generation_bytes_per_s"] = rate
        out["perf/generation_bandwidth_frac"] = rate / peak.copy_bytes_per_s
    return out


def fractions_above_peak(metrics: Mapping[str, float]) -> dict[str, float]:
    """The fractions of the machine's peak in ``metrics`` (``perf/mfu_*``, ``perf/generation_bandwidth_frac``)
    that exceed 1. A phase cannot beat the machine's limit, so each one says the stored peak is too low:
    typically measured while other jobs shared the machine."""
    return {
        key: value
        for key, value in sorted(metrics.items())
        if (key.startswith("perf/mfu_") or key == "perf/generation_bandwidth_frac") and value > 1.0
    }
