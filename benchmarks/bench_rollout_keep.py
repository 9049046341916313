"""What the rollout-keep protocol saves: the token columns it keeps off the controller -> worker path.

`trainer.steps.generate` has the actor workers keep each row's `HELD_COLUMNS` (``input_ids``,
``attention_mask``, ``responses``, ``response_mask``, all int64) so that `compute_log_prob`,
`compute_ref_log_prob` and `update_actor` get ``rollout_ids [rows]`` in their place, and generation
does not return the prompt columns (``input_ids``, ``attention_mask``, ``position_ids``) repeated ``n``
times. This script times both sides on a real Ray
worker group (``--ranks`` colocated processes in one gloo process group, a worker whose data-parallel
methods receive a Batch and answer a row count), at two shapes:

- ``smollm2``: recipes/smollm2/config.yaml, 8 prompts x 8 samples = 64 rows, prompts padded to
  ``max_prompt_length`` 64, responses to ``max_response_length`` 128;
- ``25m``: the 25.3M model of benchmarks/trl/bench_grpo.py ``--sizes small`` with 512-token responses,
  16 prompts x 8 samples = 128 rows, 8-token prompts.

Per call, the median seconds (over ``--repeats``, the two variants interleaved) of a data-parallel call
sending the held columns against one sending ``rollout_ids`` (both with the call's other columns:
``advantages`` and ``rollout_log_probs`` for the update), and of a generation-shaped call returning
the repeated prompt columns or not. Against that saving stand the protocol's own costs, also timed:
the all-gather of every rank's held rows at generation (``all_gather_object`` on the group), the
controller's store (``put`` once, ``rows`` and a column-by-column comparison per call) and the
worker's join (``rows`` of its shard per call). These are the best of several runs, not the median:
on a loaded host a median of CPU-bound work grows with the load, and the best case favours the
protocol. The calls a step makes follow the shape's config: one on-policy update (GRPO with one
optimizer step and no KL loss, as both configurations run) or, for comparison, log-prob, reference
and update (PPO with a KL loss).

The step times to compare with are cited, not measured (docs/benchmarks.md): SmolLM2's fastest median
step (steps 41-70), and the 25.3M model's fastest step (bf16, 256 rows x 128 new tokens), scaled
linearly to this shape's response tokens (a lower bound: attention grows faster than linearly).

Also counts the protocol's lines: the files that exist for it, its functions elsewhere, and the other
lines that name it.

Run:  RAY_AUTH_MODE=disabled python benchmarks/bench_rollout_keep.py [--repeats 15] [--ranks 2]
"""

from __future__ import annotations

import argparse
import ast
import itertools
import os
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ray
import torch
import torch.distributed as dist

from hybridflow.contract import ROLLOUT_IDS
from hybridflow.controller import (
    DataParallel,
    RayWorkerGroup,
    ResourcePool,
    RoleSpec,
    Worker,
    create_colocated_worker_groups,
    register,
)
from hybridflow.protocol import Batch
from hybridflow.rollout.concat import PROMPT_COLUMNS
from workers.rollout_store import HELD_COLUMNS, RolloutStore

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Shape:
    """One step's rollouts: ``prompts x samples`` rows of ``prompt_len + response_len`` tokens, and the
    step time (seconds) they are compared with, with where that figure comes from."""

    name: str
    prompts: int
    samples: int
    prompt_len: int
    response_len: int
    step_s: float
    step_source: str

    @property
    def rows(self) -> int:
        return self.prompts * self.samples


# docs/benchmarks.md, "A real pretrained model": median step of steps 41-70 (14.7 s; 23.2 s over
# 11-40, 52.8 s over 1-10). The fastest, so the largest share.
SMOLLM2 = Shape(
    name="smollm2 (64 rows, 64 + 128 tokens)",
    prompts=8,
    samples=8,
    prompt_len=64,
    response_len=128,
    step_s=14.7,
    step_source="docs/benchmarks.md SmolLM2-135M, median step of steps 41-70 (fastest; 23.2 s and 52.8 s earlier)",
)
# docs/benchmarks.md, "Step time": 23.7 s for 256 rows x 128 new tokens (bf16, the fastest 25.3M step),
# i.e. 23.7 / (256 * 128) s per response token; this shape has 128 * 512 of them.
SMALL_STEP_S = 23.7 * (128 * 512) / (256 * 128)
SMALL_25M = Shape(
    name="25.3M (128 rows, 8 + 512 tokens)",
    prompts=16,
    samples=8,
    prompt_len=8,
    response_len=512,
    step_s=SMALL_STEP_S,
    step_source="docs/benchmarks.md 25.3M bf16 step 23.7 s at 256 rows x 128 tokens, scaled to 128 x 512 tokens",
)


class SinkWorker(Worker):
    """Stands in for the actor: receives what the real methods receive, answers next to nothing."""

    @register(dispatch=DataParallel())
    def take(self, batch: Batch) -> int:
        """A log-prob, reference or update call's transfer: the rows arrive, a count goes back."""
        return len(batch)

    @register(dispatch=DataParallel())
    def generate_like(self, prompts: Batch, samples: int, response_len: int, with_prompts: bool) -> Batch:
        """A generation call's answer: the engine's columns for ``samples`` per prompt, plus the prompt
        columns repeated when the rows are not kept."""
        rows = len(prompts) * samples
        out = Batch(
            {
                "responses": torch.ones(rows, response_len, dtype=torch.long),
                "response_mask": torch.ones(rows, response_len, dtype=torch.long),
                "rollout_log_probs": torch.zeros(rows, response_len),
                "response_lengths": torch.full((rows,), response_len),
            }
        )
        if with_prompts:
            return prompts.repeat(samples) | out
        return out | Batch({ROLLOUT_IDS: torch.arange(rows)})

    @register(dispatch="one_to_all")
    def all_gather_held(self, rows: int, prompt_len: int, response_len: int, repeats: int) -> float:
        """Best seconds of the all-gather `generate_sequences` runs with a keep: every rank sends its
        ``rows`` held rows to every other rank."""
        shard = held_rows(rows, prompt_len, response_len)
        times = []
        for _ in range(repeats + 1):
            gathered = [None] * dist.get_world_size()
            dist.barrier()
            start = time.perf_counter()
            dist.all_gather_object(gathered, (dist.get_rank(), shard))
            times.append(time.perf_counter() - start)
        return min(times[1:])


def held_rows(rows: int, prompt_len: int, response_len: int) -> Batch:
    """The `HELD_COLUMNS` of ``rows`` rollout rows, int64 as generation makes them."""
    generator = torch.Generator().manual_seed(rows)
    prompt = torch.randint(1, 30000, (rows, prompt_len), generator=generator)
    response = torch.randint(1, 30000, (rows, response_len), generator=generator)
    columns = {
        "input_ids": prompt,
        "attention_mask": torch.ones(rows, prompt_len, dtype=torch.long),
        "responses": response,
        "response_mask": torch.ones(rows, response_len, dtype=torch.long),
    }
    assert set(columns) == set(HELD_COLUMNS), f"HELD_COLUMNS changed: {HELD_COLUMNS}"
    return Batch(columns)


def interleaved_medians(
    first: Callable[[], object], second: Callable[[], object], repeats: int
) -> tuple[float, float]:
    """Median seconds of ``first`` and of ``second``, run alternately after one warm-up each."""
    first(), second()
    a, b = [], []
    for _ in range(repeats):
        for fn, times in ((first, a), (second, b)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(a), statistics.median(b)


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The shortest of ``repeats`` runs of ``fn`` after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def prompt_rows(shape: Shape) -> Batch:
    """The step's prompts as the loader collates them (`PROMPT_COLUMNS`, int64)."""
    held = held_rows(shape.rows, shape.prompt_len, shape.response_len)[: shape.prompts]
    positions = (held["attention_mask"].cumsum(dim=1) - 1).clamp(min=0)
    prompts = held.select("input_ids", "attention_mask") | Batch({"position_ids": positions})
    assert set(prompts.keys()) == set(PROMPT_COLUMNS), f"PROMPT_COLUMNS changed: {PROMPT_COLUMNS}"
    return prompts


def transfers(group: RayWorkerGroup, shape: Shape, repeats: int, ranks: int) -> dict[str, float]:
    """Seconds of the transfers the protocol avoids (per call) and of the all-gather it adds."""
    held = held_rows(shape.rows, shape.prompt_len, shape.response_len)
    ids = Batch({ROLLOUT_IDS: torch.arange(shape.rows)})
    update_extra = update_columns(shape)
    prompts = prompt_rows(shape)
    full_update, kept_update = interleaved_medians(
        lambda: group.take(held | update_extra), lambda: group.take(ids | update_extra), repeats
    )
    full_forward, kept_forward = interleaved_medians(
        lambda: group.take(held), lambda: group.take(ids), repeats
    )
    gen_full, gen_kept = interleaved_medians(
        lambda: group.generate_like(prompts, shape.samples, shape.response_len, True),
        lambda: group.generate_like(prompts, shape.samples, shape.response_len, False),
        repeats,
    )
    gather_s = max(group.all_gather_held(shape.rows // ranks, shape.prompt_len, shape.response_len, repeats))
    return {
        "update_saved_s": full_update - kept_update,
        "forward_saved_s": full_forward - kept_forward,
        "generate_saved_s": gen_full - gen_kept,
        "update_full_s": full_update,
        "update_kept_s": kept_update,
        "gather_s": gather_s if ranks > 1 else 0.0,
        "held_bytes": float(held.nbytes()),
        "prompt_bytes": float(prompts.repeat(shape.samples).nbytes()),
    }


def update_columns(shape: Shape) -> Batch:
    """The update's columns besides the held ones: ``advantages`` and ``rollout_log_probs`` (float32)."""
    floats = torch.randn(shape.rows, shape.response_len, generator=torch.Generator().manual_seed(0))
    return Batch({"advantages": floats, "rollout_log_probs": floats.clone()})


def local_work(shape: Shape, repeats: int, ranks: int) -> dict[str, float]:
    """Seconds of the protocol's own work, as the controller and a worker do it (the same code, run in
    this process before Ray starts, on one thread): the controller's store ``put`` (once a step), its
    lookup and column-by-column comparison, and a worker's join of its shard (once per call)."""
    held = held_rows(shape.rows, shape.prompt_len, shape.response_len)
    update_extra = update_columns(shape)
    store = RolloutStore(pad_token_id=0)
    row_ids = torch.arange(shape.rows)
    steps = itertools.count()
    shard = shape.rows // ranks

    def lookup_and_compare() -> None:
        kept = store.rows(row_ids)
        for column in HELD_COLUMNS:
            assert torch.equal(kept[column], held[column])

    def worker_join() -> None:
        kept = store.rows(row_ids[:shard])
        kept.select(*[c for c in kept.keys() if c not in update_extra], meta=False) | update_extra[:shard]

    # Each put is a new step, so the store drops the previous rows first, as in a run. Milliseconds
    # each: four times the repeats give a best case that the host's load rarely reaches.
    return {
        "put_s": best_seconds(lambda: store.put(next(steps), row_ids, held), 4 * repeats),
        "compare_s": best_seconds(lookup_and_compare, 4 * repeats),
        "join_s": best_seconds(worker_join, 4 * repeats),
    }


def report(shape: Shape, m: dict[str, float]) -> None:
    print(f"\n=== {shape.name}: step {shape.step_s:.1f} s ({shape.step_source})")
    print(
        f"held columns {m['held_bytes'] / 1e3:.0f} kB per call; update call {m['update_full_s'] * 1e3:.2f} ms "
        f"with them, {m['update_kept_s'] * 1e3:.2f} ms with rollout_ids"
    )
    print(
        f"saved per call: update {m['update_saved_s'] * 1e3:.2f} ms, log-prob/ref "
        f"{m['forward_saved_s'] * 1e3:.2f} ms; generation's repeated prompt columns "
        f"({m['prompt_bytes'] / 1e3:.0f} kB) {m['generate_saved_s'] * 1e3:.2f} ms"
    )
    print(
        f"added: all-gather at generation {m['gather_s'] * 1e3:.2f} ms, controller store put "
        f"{m['put_s'] * 1e3:.2f} ms; per call: controller lookup + comparison {m['compare_s'] * 1e3:.2f} ms, "
        f"worker join {m['join_s'] * 1e3:.2f} ms"
    )
    for label, forwards in (("GRPO, one on-policy update", 0), ("PPO-like: log-prob + ref + update", 2)):
        calls = 1 + forwards
        saved = m["generate_saved_s"] + m["update_saved_s"] + forwards * m["forward_saved_s"]
        added = m["gather_s"] + m["put_s"] + calls * (m["compare_s"] + m["join_s"])
        net = saved - added
        print(
            f"{label}: saved {saved * 1e3:.1f} ms, added {added * 1e3:.1f} ms, net {net * 1e3:+.1f} ms "
            f"= {100 * net / shape.step_s:+.3f}% of the step (gross {100 * saved / shape.step_s:.3f}%)"
        )


PROTOCOL_FILES = ("workers/rollout_store.py",)
PROTOCOL_TESTS = ("tests/workers/test_rollout_store.py", "tests/workers/test_kept_rollouts.py")
PROTOCOL_FUNCTIONS = {
    "workers/actor.py": ("_keep_rollouts", "_with_held_columns"),
    "trainer/steps.py": ("actor_batch", "_same"),
}
PROTOCOL_NAMES = re.compile(
    r"RolloutKeep|RolloutStore|HELD_COLUMNS|ROLLOUT_IDS|rollout_ids|kept_rollouts|rollout_store|_keep_rollouts"
    r"|_with_held_columns"
)
# The contract's ``held`` parameter is the protocol's; elsewhere "held" and "keep" are ordinary words.
HELD_PARAMETER = re.compile(r"\bheld\b")
HELD_PARAMETER_FILES = (
    "hybridflow/contract.py",
    "hybridflow/controller/register.py",
    "hybridflow/controller/group.py",
)
PROTOCOL_SOURCES = ("hybridflow", "workers", "trainer", "recipes")


def protocol_lines() -> dict[str, int]:
    """Lines per file that exist for the protocol: whole files, its functions, and the other lines that
    name its identifiers (a lower bound: prose about it in other docstrings is not counted)."""
    counts: dict[str, int] = {}
    for path in (*PROTOCOL_FILES, *PROTOCOL_TESTS):
        if (REPO / path).exists():
            counts[path] = len((REPO / path).read_text().splitlines())
    for root in PROTOCOL_SOURCES:
        for file in sorted((REPO / root).rglob("*.py")):
            path = str(file.relative_to(REPO))
            if path in counts:
                continue
            text = file.read_text()
            functions = PROTOCOL_FUNCTIONS.get(path, ())
            lines: set[int] = set()
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.FunctionDef) and node.name in functions:
                    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    lines.update(range(start, (node.end_lineno or node.lineno) + 1))
            for number, line in enumerate(text.splitlines(), 1):
                if PROTOCOL_NAMES.search(line) or (
                    path in HELD_PARAMETER_FILES and HELD_PARAMETER.search(line)
                ):
                    lines.add(number)
            if lines:
                counts[path] = len(lines)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()

    counts = protocol_lines()
    source = sum(n for path, n in counts.items() if not path.startswith("tests/"))
    print(
        f"protocol lines: {source} in {sum(not p.startswith('tests/') for p in counts)} source files, "
        f"{sum(n for p, n in counts.items() if p.startswith('tests/'))} in tests"
    )
    for path, n in sorted(counts.items()):
        print(f"  {n:5d}  {path}")

    shapes = (SMOLLM2, SMALL_25M)
    # One thread, as a worker of a one-CPU slot runs: on a loaded host a second thread's wake-up at
    # every parallel op would swamp these sub-millisecond copies.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    local = [local_work(shape, args.repeats, args.ranks) for shape in shapes]
    torch.set_num_threads(threads)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    temp_dir = tempfile.mkdtemp(prefix="hf-bench-", dir="/tmp")
    ray.init(num_cpus=4, include_dashboard=False, _temp_dir=temp_dir, logging_level="WARNING")
    try:
        pool = ResourcePool([args.ranks], cpus_per_slot=0.5, name="bench")
        group = create_colocated_worker_groups(pool, {"sink": RoleSpec(SinkWorker)})["sink"]
        for shape, own in zip(shapes, local, strict=True):
            report(shape, {**transfers(group, shape, args.repeats, args.ranks), **own})
        print(
            f"\nload average at the end (1 / 5 / 15 min): {' / '.join(f'{x:.1f}' for x in os.getloadavg())}"
        )
        group.hosts.shutdown()
        pool.release()
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
