"""A projection, not a measurement: the step time of synchronous RL against asynchronous RL on GPUs.

The setting that motivates the library: a 7B-parameter policy on 8 GPUs, 64 prompts x 16 samples per
step, response lengths heavy-tailed from 50 to 50,000 tokens. Nothing here runs a model: decode and
training time come from a cost model whose every constant is printed with the table (``--help`` lists
them; each is a flag). Four schedules of the same work are compared:

- **sync colocated**: every GPU generates the whole batch, then every GPU trains on it. A generation
  round lasts until its longest sample ends; as samples finish, the engine's batch thins out.
- **sync + partial rollouts** (colocated): a round stops as soon as one batch worth of samples has
  finished; unfinished samples pause and continue in the next round (their context is prefilled again),
  and every round refills the engine with new prompts, so the engine never runs nearly empty.
- **one-step-off** (disaggregated): ``G`` GPUs generate batch t+1 while ``8 - G`` train on batch t; the
  step is the slower of the two. The generation round is still synchronous (it waits for its longest
  sample).
- **fully async** (disaggregated): the generation GPUs run a continuous stream (a finished sample's slot
  takes the next prompt at once); the trainer takes a batch whenever one batch worth has finished.

Cost model (memory-bound decode, compute-bound training and prefill):

- one decode step of an engine with ``b`` running samples whose contexts sum to ``C`` tokens takes
  ``(weight_bytes + kv_bytes_per_token * C) / bandwidth + step_overhead`` seconds and yields ``b``
  tokens; at most ``slots`` samples run at once per engine (one engine per GPU);
- training a token costs ``train_flops_per_param * params`` FLOPs (update 6N, old log-prob 2N, reference
  2N), at ``mfu`` of the GPU's dense bf16 peak; a prefill token costs ``2N`` FLOPs at the same rate;
- weight pushes and layout switches cost ``switch_s`` per step (colocated) or ``push_s`` (disaggregated,
  overlapped with nothing: a conservative choice).

The split ``G`` of the disaggregated schedules is chosen as the best of 1..7. The share of the step the
synchronous colocated run spends generating is printed: the setting's premise is about 80%.

    python benchmarks/project_async_speedup.py [--gpus 8] [--prompts 64] [--samples 16] [--seed 0]
"""

from __future__ import annotations

import argparse
import heapq
import math
from dataclasses import dataclass, fields

import numpy as np


@dataclass(frozen=True)
class CostModel:
    """Hardware and model constants (H200-class GPU, a 7.6B-parameter GQA model in bf16)."""

    params: float = 7.6e9
    weight_bytes: float = 15.2e9  # bf16
    kv_bytes_per_token: float = 57_344  # 28 layers x 4 KV heads x 128 dims x (K, V) x 2 bytes
    bandwidth: float = 4.8e12 * 0.8  # HBM bytes/s, 80% achieved
    step_overhead: float = 1.0e-3  # s per decode step: sampling, scheduling, launches
    slots: int = 256  # running samples per engine
    peak_flops: float = 989e12  # dense bf16 FLOP/s
    mfu: float = 0.4
    train_flops_per_param: float = 10.0  # 6N update + 2N old log-prob + 2N reference, per token
    prompt_tokens: int = 512
    switch_s: float = 2.0  # colocated: resharding to and from the inference layout, per step
    push_s: float = 3.0  # disaggregated: the weight broadcast to the engines, per step
    kv_capacity_tokens: float = 1.9e6  # (0.9 x 139 GB - weights) / kv_bytes_per_token, per engine

    def decode_time(self, steps: float, running: int, context: float) -> float:
        """Seconds for ``steps`` decode steps of ``running`` samples whose contexts sum to ``context`` tokens
        at the first step (each step adds ``running`` tokens to the sum)."""
        context_steps = steps * context + running * steps * (steps - 1) / 2
        return steps * (self.weight_bytes / self.bandwidth + self.step_overhead) + (
            self.kv_bytes_per_token * context_steps / self.bandwidth
        )

    def train_time(self, tokens: float, gpus: int) -> float:
        """Seconds to train on ``tokens`` (prompt and response) with ``gpus`` GPUs."""
        return self.train_flops_per_param * self.params * tokens / (gpus * self.peak_flops * self.mfu)

    def prefill_time(self, tokens: float) -> float:
        """Seconds for one GPU to prefill ``tokens``."""
        return 2 * self.params * tokens / (self.peak_flops * self.mfu)


def sample_lengths(count: int, low: int, high: int, rng: np.random.Generator) -> np.ndarray:
    """``[count]`` response lengths, log-uniform on ``[low, high]`` tokens (median ~ sqrt(low * high))."""
    return np.exp(rng.uniform(math.log(low), math.log(high), count)).round().astype(np.int64)


@dataclass
class EngineRun:
    """What one engine did: ``seconds`` in all, and per finished sample (in finishing order) the second it
    finished and its response length; ``paused`` are the ``(remaining, context)`` of the samples still
    running or waiting when it stopped."""

    seconds: float
    finish_s: list[float]
    lengths: list[int]
    paused: list[tuple[int, int]]


def run_engine(
    model: CostModel, waiting: list[tuple[int, int]], stop_after: int, budget: int | None = None
) -> EngineRun:
    """One engine, event by event. ``waiting`` are ``(remaining tokens, context tokens)`` in admission
    order: a fresh sample has the prompt as context, a paused one its prompt and the tokens it has so far
    (prefilled again). A sample is admitted when a slot is free and the KV cache can hold its whole final
    context (no preemption); when one finishes, the next takes its place. Stops once ``stop_after``
    samples have finished, or nothing is left. With a ``budget``, a sample generates at most that many
    tokens after its admission; one that reaches it without finishing pauses (and frees its slot)."""
    queue = list(reversed(waiting))  # pop() from the end takes them in order
    # heap of (step it stops at, start step, context at start, remaining at start)
    running: list[tuple[int, int, int, int]] = []
    seconds, step, context_sum, reserved = 0.0, 0, 0, 0
    run = EngineRun(0.0, [], [], [])

    def admit() -> None:
        nonlocal seconds, context_sum, reserved
        while queue and len(running) < model.slots and reserved + sum(queue[-1]) <= model.kv_capacity_tokens:
            remaining, context = queue.pop()
            seconds += model.prefill_time(context)
            heapq.heappush(running, (step + min(remaining, budget or remaining), step, context, remaining))
            context_sum += context
            reserved += remaining + context

    admit()
    while running and len(run.lengths) < stop_after:
        finish = running[0][0]
        seconds += model.decode_time(finish - step, len(running), context_sum)
        context_sum += len(running) * (finish - step)
        step = finish
        while running and running[0][0] == step:
            _, start, context, remaining = heapq.heappop(running)
            final_context = context + step - start
            context_sum -= final_context
            reserved -= context + remaining
            if step - start < remaining:  # reached the budget: pauses
                run.paused.append((remaining - (step - start), final_context))
                continue
            run.finish_s.append(seconds)
            run.lengths.append(final_context - model.prompt_tokens)
        admit()
    run.seconds = seconds
    run.paused += [
        (start + remaining - step, context + step - start) for _, start, context, remaining in running
    ]
    run.paused += reversed(queue)
    return run


def fresh(model: CostModel, lengths: list[int]) -> list[tuple[int, int]]:
    """New samples of response ``lengths`` as ``(remaining, context)``."""
    return [(length, model.prompt_tokens) for length in lengths]


def share(lengths: np.ndarray, engine: int, engines: int) -> list[int]:
    """The samples of a batch that ``engine`` of ``engines`` generates (dealt round-robin)."""
    return lengths[engine::engines].tolist()


def sync_round_s(model: CostModel, batches: list[np.ndarray], engines: int) -> float:
    """Mean seconds of a synchronous generation round: every sample to its end; the slowest engine."""
    return float(
        np.mean(
            [
                max(
                    run_engine(model, fresh(model, share(b, e, engines)), len(b)).seconds
                    for e in range(engines)
                )
                for b in batches
            ]
        )
    )


def partial_rounds(
    model: CostModel, batches: list[np.ndarray], engines: int, budget: int
) -> tuple[float, float, float]:
    """Partial rollouts: each round takes one new batch and the samples paused before (queued first); a
    sample generates at most ``budget`` tokens per round, then pauses until the next round (after the
    update, so its context is prefilled again). The trainer trains on the round's finished samples.
    Returns, over the rounds after the first third, the mean generation seconds per round and the mean
    number of samples finished per round, and the mean response length finished."""
    paused: list[list[tuple[int, int]]] = [[] for _ in range(engines)]
    seconds, finished, lengths = [], [], []
    for index, batch in enumerate(batches):
        times, done = [], 0
        for engine in range(engines):
            queue = paused[engine] + fresh(model, share(batch, engine, engines))
            run = run_engine(model, queue, len(queue), budget)
            paused[engine] = run.paused
            times.append(run.seconds)
            done += len(run.lengths)
            if index >= len(batches) // 3:
                lengths += run.lengths
        if index >= len(batches) // 3:
            seconds.append(max(times))
            finished.append(done)
    return float(np.mean(seconds)), float(np.mean(finished)), float(np.mean(lengths))


def stream_batch_s(model: CostModel, batches: list[np.ndarray], engines: int) -> float:
    """Fully async: each engine runs one continuous stream of every batch's share, never interrupted
    (a running sample keeps its KV cache across weight pushes). Returns the steady-state seconds per batch:
    the time between the slowest engine's finishing of batch worths, from the first third of the stream
    to the end."""
    per_batch = len(batches[0]) // engines
    first = len(batches) // 3
    rates = []
    for engine in range(engines):
        mine = [length for batch in batches for length in share(batch, engine, engines)]
        run = run_engine(model, fresh(model, mine), len(mine))
        begin, end = run.finish_s[first * per_batch - 1], run.finish_s[len(batches) * per_batch - 1]
        rates.append((end - begin) / (len(batches) - first))
    return max(rates)


@dataclass(frozen=True)
class Projection:
    """One schedule's projected seconds per step and its parts."""

    schedule: str
    step_s: float
    generation_s: float
    train_s: float
    generation_gpus: int
    mean_trained_length: float


def project(
    model: CostModel, gpus: int, prompts: int, samples: int, low: int, high: int, budget: int, seed: int
) -> list[Projection]:
    """The four schedules' projections for the same stream of batches (``seed`` draws the lengths)."""
    rng = np.random.default_rng(seed)
    batches = [sample_lengths(prompts * samples, low, high, rng) for _ in range(24)]
    mean_length = float(np.mean(np.concatenate(batches)))

    def train_s(length: float, train_gpus: int) -> float:
        return model.train_time(prompts * samples * (length + model.prompt_tokens), train_gpus)

    sync = sync_round_s(model, batches[:6], gpus)
    rows = [
        Projection(
            "sync colocated",
            sync + train_s(mean_length, gpus) + model.switch_s,
            sync,
            train_s(mean_length, gpus),
            gpus,
            mean_length,
        )
    ]
    # per batch worth of finished samples: a round finishes about one batch in steady state
    partial, done, partial_length = partial_rounds(model, batches, gpus, budget)
    per_batch = prompts * samples / done
    rows.append(
        Projection(
            "sync + partial rollouts",
            (partial + train_s(partial_length, gpus) * done / (prompts * samples) + model.switch_s)
            * per_batch,
            partial * per_batch,
            train_s(partial_length, gpus),
            gpus,
            partial_length,
        )
    )
    off, stream = [], []
    for gen_gpus in range(1, gpus):
        train = train_s(mean_length, gpus - gen_gpus)
        gen = sync_round_s(model, batches[:6], gen_gpus)
        off.append(
            Projection("one-step-off", max(gen, train) + model.push_s, gen, train, gen_gpus, mean_length)
        )
        gen = stream_batch_s(model, batches, gen_gpus)
        stream.append(
            Projection("fully async", max(gen, train) + model.push_s, gen, train, gen_gpus, mean_length)
        )
    rows.append(min(off, key=lambda row: row.step_s))
    rows.append(min(stream, key=lambda row: row.step_s))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--min-length", type=int, default=50)
    parser.add_argument("--max-length", type=int, default=50_000)
    parser.add_argument("--partial-budget", type=int, default=8192, help="tokens per sample per round")
    parser.add_argument("--seed", type=int, default=0)
    defaults = CostModel()
    for field in fields(CostModel):
        parser.add_argument(
            f"--{field.name.replace('_', '-')}",
            type=type(getattr(defaults, field.name)),
            default=getattr(defaults, field.name),
        )
    args = parser.parse_args()
    model = CostModel(**{field.name: getattr(args, field.name) for field in fields(CostModel)})
    print("PROJECTION (cost model, no model run). Assumptions:")
    for field in fields(CostModel):
        print(f"  {field.name} = {getattr(model, field.name):g}")
    print(
        f"  {args.gpus} GPUs, {args.prompts} prompts x {args.samples} samples per step, response lengths "
        f"log-uniform on [{args.min_length}, {args.max_length}] tokens, seed {args.seed}"
    )
    rows = project(
        model,
        args.gpus,
        args.prompts,
        args.samples,
        args.min_length,
        args.max_length,
        args.partial_budget,
        args.seed,
    )
    base = rows[0]
    print(f"sync colocated: generation is {base.generation_s / base.step_s:.0%} of the step")
    print("| schedule | generation GPUs | generation s | train s | step s | speed-up | mean trained length |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(
            f"| {row.schedule} | {row.generation_gpus} | {row.generation_s:.0f} | {row.train_s:.0f} | "
            f"{row.step_s:.0f} | {base.step_s / row.step_s:.2f}x | {row.mean_trained_length:.0f} |"
        )


if __name__ == "__main__":
    main()
