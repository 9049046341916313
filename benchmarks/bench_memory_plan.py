"""The memory planner (`trainer.plan`) against the memory that real ranks use, phase by phase.

For each run config below, two ranks in a gloo group (spawned processes, no Ray) each build the
trainer's own worker objects with the trainer's own settings (`trainer.roles`): the colocated
`ActorRolloutRefWorker` (FSDP2 actor, vLLM engine, reference policy when the config needs one) and
`CriticWorker` when it has a critic. Then they run two steps of the trainer's phases in the trainer's
order (`trainer.algorithms.rl_step`): generation (both layout switches), log-probs, reference
log-probs, values, critic update, actor update. Prompts have ``data.max_prompt_length`` tokens;
the training phases get responses of ``data.max_response_length`` tokens with every token valid, the
worst case the planner assumes.

What is compared. On CPU a process's memory includes what any process of the library holds before
it loads a model (Python, torch, vLLM's modules, the process groups and device meshes: about 0.5 GiB).
The planner leaves that baseline out, so the measurement does too: each rank records its memory once
its workers are constructed and before ``init_model``, and every phase's figure is the phase's peak
(sampled every millisecond) minus that baseline. Two kinds of memory are recorded:

- **live heap**: bytes allocated through malloc and not yet freed (glibc's ``mallinfo2``: heap chunks
  in use plus mmapped chunks). torch's CPU tensors, vLLM's weights and KV cache all come from there.
  This is the host counterpart of CUDA's allocated memory and the quantity the planner estimates;
- **resident**: anonymous resident memory (``/proc/self/statm`` resident minus shared). On top of the
  live heap it holds what glibc keeps of freed memory for reuse; the ranks hand that back before each
  phase, but within a phase (micro-batch after micro-batch) it can grow.

Figures are the larger rank's, from the second step (the steady state: the optimizer state exists).

A config that places the rollout on a pool of its own (``grpo-split``) runs each pool as a process
group of its own, as on Ray: the actor's ranks (`ActorRolloutRefWorker` without an engine) and the
rollout pool's ranks (`workers.rollout.RolloutWorker`, a vLLM engine each), joined by the weight group
(gloo). The actor's generation phase is the weight push (every rank gathers, rank 0 packs and
broadcasts); the engine's is the push received and loaded, then sampling. Each process kind is
compared with its own table of the plan (``actor_rollout`` and ``rollout``); while the actor trains
the engine is idle, and what it holds then is what stays allocated after its sampling.

``--runtime`` measures the vLLM engine's own memory (besides weights and KV cache) that the planner
carries as a constant (`trainer.plan.VLLM_CPU_RUNTIME_BYTES`), on a model whose weights are negligible.

Run:  python benchmarks/bench_memory_plan.py [--configs grpo-32k ppo-ckpt-tp2 grpo-bf16-dynamic grpo-split]
      [--runtime] [--json out.json]
Results and their reading: docs/benchmarks.md, docs/planning.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from hybridflow.planning.host_memory import (  # noqa: E402  (after the repository is on the path)
    HostPeakSampler,
    anonymous_resident_bytes,
    live_heap_bytes,
)

CACHE_DIR = REPO_ROOT / ".cache"
MIB = 2**20
_TOKENIZER_VOCAB = 100  # ids every vocabulary here has (the character tokenizer's)

_COMMON = [
    "resource.nodes=1",
    "resource.slots_per_node=2",
    "rollout.engine=vllm",
    "rollout.temperature=1.0",
    f"rollout.cache_dir={CACHE_DIR}",
    "reward.num_workers=1",
    "trainer.total_steps=2",
    "trainer.loggers=[jsonl]",
]

# GRPO's batches: 16 prompts x 4 samples of 32 + 64 tokens, 8-row micro-batches, tp-1 engines.
_GRPO_BATCHES = [
    "data.max_prompt_length=32",
    "data.max_response_length=64",
    "data.train_batch_size=16",
    "rollout.n=4",
    "rollout.tp_size=1",
    "rollout.kv_cache_bytes=134217728",
    "rollout.max_num_seqs=64",
    "actor.ppo_mini_batch_size=64",
    "actor.ppo_micro_batch_size=8",
    "actor.forward_micro_batch_size=16",
    "actor.weight_decay=0.0",
]

CONFIGS: dict[str, list[str]] = {
    # A 56M Qwen2 with a 32k vocabulary: the chunked logit head is the largest activation.
    "grpo-32k": [
        "model.tiny.vocab_size=32000",
        "model.tiny.hidden_size=512",
        "model.tiny.num_layers=8",
        "model.tiny.num_heads=8",
        "model.tiny.num_kv_heads=4",
        "model.tiny.intermediate_size=1408",
        "model.tiny.max_position_embeddings=128",
        *_GRPO_BATCHES,
    ],
    # PPO: critic and reference colocated with the actor, activation checkpointing, one engine over
    # both ranks, a character vocabulary, two optimizer steps per batch (so a log-prob pass).
    "ppo-ckpt-tp2": [
        "model.tiny.hidden_size=768",
        "model.tiny.num_layers=6",
        "model.tiny.num_heads=12",
        "model.tiny.num_kv_heads=4",
        "model.tiny.intermediate_size=2048",
        "model.tiny.max_position_embeddings=256",
        "data.max_prompt_length=64",
        "data.max_response_length=128",
        "data.train_batch_size=16",
        "rollout.n=2",
        "rollout.tp_size=2",
        "rollout.kv_cache_bytes=67108864",
        "rollout.max_num_seqs=32",
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_in_reward=true",
        "actor.ppo_mini_batch_size=16",
        "actor.ppo_micro_batch_size=4",
        "actor.forward_micro_batch_size=8",
        "actor.activation_checkpointing=true",
        "critic.ppo_mini_batch_size=16",
        "critic.ppo_micro_batch_size=4",
        "critic.forward_micro_batch_size=8",
        "critic.activation_checkpointing=true",
    ],
    # bf16 compute on fp32 master weights, token-budget micro-batches, a KL loss (reference policy)
    # and an entropy bonus.
    "grpo-bf16-dynamic": [
        "model.tiny.vocab_size=16384",
        "model.tiny.hidden_size=512",
        "model.tiny.num_layers=8",
        "model.tiny.num_heads=8",
        "model.tiny.num_kv_heads=2",
        "model.tiny.intermediate_size=1536",
        "model.tiny.max_position_embeddings=256",
        "data.max_prompt_length=48",
        "data.max_response_length=80",
        "data.train_batch_size=16",
        "rollout.n=4",
        "rollout.tp_size=1",
        "rollout.kv_cache_bytes=67108864",
        "rollout.max_num_seqs=64",
        "actor.param_dtype=bfloat16",
        "actor.ppo_mini_batch_size=64",
        "actor.dynamic_batching=true",
        "actor.max_tokens_per_micro_batch=2048",
        "actor.use_kl_loss=true",
        "actor.entropy_coef=0.001",
    ],
    # The rollout on a pool of its own (docs/rollout_service.md): the actor's 2 ranks and one vLLM engine
    # in a third process; each generation is the cross-pool push (16 MiB buckets over a gloo weight
    # group; the 49 MiB embedding and head travel alone) and the engine's sampling.
    "grpo-split": [
        "resource.pools={rollout_pool: {nodes: 1, slots_per_node: 1}}",
        "resource.placement={rollout: rollout_pool}",
        "model.tiny.vocab_size=32000",
        "model.tiny.hidden_size=384",
        "model.tiny.num_layers=4",
        "model.tiny.num_heads=6",
        "model.tiny.num_kv_heads=2",
        "model.tiny.intermediate_size=1024",
        "model.tiny.max_position_embeddings=128",
        *_GRPO_BATCHES,
    ],
}

# A model whose weights are a few hundred KiB: what the engine holds besides them is its runtime.
RUNTIME_CONFIG = [
    "model.tiny.hidden_size=64",
    "model.tiny.num_layers=2",
    "model.tiny.num_heads=2",
    "model.tiny.num_kv_heads=2",
    "model.tiny.intermediate_size=128",
    "model.tiny.max_position_embeddings=64",
    "data.max_prompt_length=16",
    "data.max_response_length=16",
    "data.train_batch_size=16",
    "rollout.n=2",
    "rollout.tp_size=1",
    "rollout.kv_cache_bytes=33554432",
    "rollout.max_num_seqs=32",
    "actor.ppo_mini_batch_size=32",
    "actor.ppo_micro_batch_size=8",
]


# ---------------------------------------------------------------------------------------- one rank


def _build_workers(config, model_dir: Path) -> tuple[Any, Any]:
    """The actor and critic workers with the arguments `trainer.roles.role_specs` gives them."""
    from trainer.config import derive_sizes
    from trainer.roles import role_specs

    specs = role_specs(config, derive_sizes(config), config.trainer.total_steps, model_dir)
    actor = specs["actor_rollout"].cls(*specs["actor_rollout"].args)
    critic = specs["critic"].cls(*specs["critic"].args) if "critic" in specs else None
    return actor, critic


def _rollout_batch(rows: int, prompt_len: int, response_len: int, vocab: int, seed: int):
    """Full-length prompts and responses (every token valid), advantages and returns."""
    import torch

    from hybridflow.protocol import Batch

    generator = torch.Generator().manual_seed(seed)
    return Batch(
        {
            "input_ids": torch.randint(4, vocab, (rows, prompt_len), generator=generator),
            "attention_mask": torch.ones(rows, prompt_len, dtype=torch.long),
            "responses": torch.randint(4, vocab, (rows, response_len), generator=generator),
            "response_mask": torch.ones(rows, response_len, dtype=torch.long),
            "advantages": torch.randn(rows, response_len, generator=generator),
            "returns": torch.randn(rows, response_len, generator=generator),
        }
    )


class _Recorder:
    """One rank's phase peaks above its baseline (taken at construction: once the workers exist and
    before ``init_model``), in MiB, one entry per call of a phase."""

    def __init__(self) -> None:
        from hybridflow.resharding.memory import return_freed_host_memory

        return_freed_host_memory()
        self.live_base, self.resident_base = live_heap_bytes(), anonymous_resident_bytes()
        self.measured: dict[str, Any] = {
            "baseline_live_mib": self.live_base / MIB,
            "baseline_resident_mib": self.resident_base / MIB,
        }

    def phase(self, name: str, method, *args, **kwargs):
        """``method(*args, **kwargs)``, recording its peaks and what stays allocated after it."""
        with HostPeakSampler() as sampler:
            result = method(*args, **kwargs)
        self.measured.setdefault(name, []).append((sampler.live - self.live_base) / MIB)
        self.measured.setdefault(f"{name}/resident", []).append((sampler.resident - self.resident_base) / MIB)
        self.measured.setdefault(f"{name}/after", []).append((live_heap_bytes() - self.live_base) / MIB)
        return result


def _install(rank: int, world: int, overrides: list[str]):
    """This rank's worker context (its pool's process group, as `run_ranks` made it) and the config."""
    import hybridflow.rollout.vllm_engine  # noqa: F401  (library imports belong to the process baseline)
    from hybridflow.controller.worker import WorkerContext, install_context
    from trainer.config import load_config

    install_context(
        WorkerContext(
            rank=rank,
            world_size=world,
            local_rank=rank,
            master_addr="127.0.0.1",
            master_port=int(os.environ["MASTER_PORT"]),
            use_gpu=False,
        )
    )
    return load_config(None, overrides)


def _prompts(config, sizes, step: int, dp_rank: int):
    """One engine's full-length prompts of ``step`` and its sampling parameters."""
    import torch

    from hybridflow.protocol import Batch
    from hybridflow.rollout.sampling import SamplingParams

    data, rollout = config.data, config.rollout
    generator = torch.Generator().manual_seed(1000 * step + dp_rank)
    shape = (sizes.prompts_per_rollout_dp_rank, data.max_prompt_length)
    prompts = Batch(
        {
            "input_ids": torch.randint(4, _TOKENIZER_VOCAB, shape, generator=generator),
            "attention_mask": torch.ones(shape, dtype=torch.long),
        }
    )
    sampling = SamplingParams(
        n=rollout.n, temperature=rollout.temperature, max_new_tokens=data.max_response_length, seed=0
    )
    return prompts, sampling


def _training_phases(
    recorder: _Recorder, config, sizes, actor, critic, step: int, rank: int, world: int
) -> None:
    """The phases after generation, in `trainer.algorithms.rl_step`'s order, on full-length rows."""
    data, rollout = config.data, config.rollout
    needs_old = sizes.actor.optimizer_steps_per_step > 1 or config.algorithm.use_kl_in_reward
    model_inputs = ("input_ids", "attention_mask", "responses", "response_mask")
    batch = _rollout_batch(
        sizes.rows_per_step // world,
        data.max_prompt_length,
        data.max_response_length,
        _TOKENIZER_VOCAB,
        100 * step + rank,
    )
    inputs = batch.select(*model_inputs)
    phase = recorder.phase
    if needs_old:
        batch = batch | phase("log_prob", actor.compute_log_prob, inputs, temperature=rollout.temperature)
    if config.needs_reference:
        batch = batch | phase("ref", actor.compute_ref_log_prob, inputs, temperature=rollout.temperature)
    if critic is not None:
        batch = batch | phase("values", critic.compute_values, inputs)
        phase("critic_update", critic.update_critic, batch.select(*model_inputs, "values", "returns"))
    extra = [c for c in ("old_log_probs", "ref_log_probs") if c in batch]
    update_batch = batch.select(*model_inputs, "advantages", *extra)
    phase("update", actor.update_actor, update_batch, temperature=rollout.temperature)


def _loaded_workers(rank: int, world: int, overrides: list[str], model_dir: str):
    """The config, its sizes, this rank's actor and critic (None without one) with their models loaded
    (the ``init_model`` phase), and the recorder whose baseline was taken before loading."""
    from trainer.config import derive_sizes

    config = _install(rank, world, overrides)
    sizes = derive_sizes(config)
    actor, critic = _build_workers(config, Path(model_dir))
    recorder = _Recorder()

    def init_models() -> None:
        actor.init_model()
        if critic is not None:
            critic.init_model()

    recorder.phase("init_model", init_models)
    return config, sizes, actor, critic, recorder


def _rank_job(rank: int, world: int, overrides: list[str], model_dir: str, steps: int) -> dict[str, Any]:
    """A colocated rank: actor, engine (and reference, critic) in one process."""
    config, sizes, actor, critic, recorder = _loaded_workers(rank, world, overrides, model_dir)
    for step in range(steps):
        prompts, sampling = _prompts(config, sizes, step, rank // sizes.rollout_tp_size)
        recorder.phase("generation", actor.generate_sequences, prompts, sampling)
        _training_phases(recorder, config, sizes, actor, critic, step, rank, world)
    return recorder.measured


def _split_actor_job(
    rank: int, world: int, overrides: list[str], model_dir: str, steps: int, weight_port: int
) -> dict[str, Any]:
    """An actor rank of a split placement: no engine; its generation phase is the weight push (all
    ranks gather, rank 0 broadcasts over the weight group to the rollout pool's engines)."""
    config, sizes, actor, critic, recorder = _loaded_workers(rank, world, overrides, model_dir)
    # As `trainer.weight_sync.connect_weight_group`: after the models are loaded.
    engines = config.resource.world_size_of("rollout")
    recorder.phase("join_weight_group", actor.join_weight_group, "127.0.0.1", weight_port, 1 + engines)
    for step in range(steps):
        recorder.phase("generation", actor.push_weights)
        _training_phases(recorder, config, sizes, actor, critic, step, rank, world)
    return recorder.measured


def _split_engine_job(
    rank: int, world: int, overrides: list[str], model_dir: str, steps: int, weight_port: int
) -> dict[str, Any]:
    """A rank of the rollout pool (`workers.rollout.RolloutWorker`): it receives each push, then
    samples; between generations it waits for the next push (the actor trains meanwhile)."""
    from trainer.config import derive_sizes
    from trainer.roles import role_specs

    config = _install(rank, world, overrides)
    sizes = derive_sizes(config)
    spec = role_specs(config, sizes, config.trainer.total_steps, Path(model_dir))["rollout"]
    engine = spec.cls(*spec.args)
    recorder = _Recorder()
    recorder.phase("init_model", engine.init_model)
    recorder.phase("join_weight_group", engine.join_weight_group, "127.0.0.1", weight_port, 1 + world)
    for step in range(steps):
        # The wait for the push (the actor's training phases of the step before) is inside "receive".
        recorder.phase("receive", engine.receive_weights)
        prompts, sampling = _prompts(config, sizes, step, rank // sizes.rollout_tp_size)
        recorder.phase("sampling", engine.generate_sequences, prompts, sampling)
        for key in ("", "/resident", "/after"):
            pair = (recorder.measured[f"receive{key}"][-1], recorder.measured[f"sampling{key}"][-1])
            recorder.measured.setdefault(f"generation{key}", []).append(
                max(pair) if key != "/after" else pair[1]
            )
    return recorder.measured


# ---------------------------------------------------------------------------------------- driver


def _measure(overrides: list[str], steps: int) -> tuple[Any, dict[str, list[dict[str, Any]]]]:
    """The plan of the config and each process kind's per-rank measurements, keyed by the plan's
    process names (the colocated one, or ``actor_rollout`` and ``rollout`` for a split placement)."""
    from hybridflow.data import write_rows
    from hybridflow.parallel.launch import run_ranks
    from hybridflow.parallel.rendezvous import hosted_store
    from trainer.config import load_config
    from trainer.model_setup import prepare_model_dir
    from trainer.plan import plan_memory

    with tempfile.TemporaryDirectory(prefix="bench_memory_plan_") as tmp:
        rows = [
            {
                "data_source": "bench",
                "prompt": [{"role": "user", "content": "1+1="}],
                "reward_model": {"ground_truth": "2"},
            }
        ] * 4
        write_rows(rows, Path(tmp) / "train.parquet")
        full = [
            *_COMMON,
            f"data.train_files=[{Path(tmp) / 'train.parquet'}]",
            f"trainer.output_dir={tmp}/out",
            *overrides,
        ]
        config = load_config(None, full)
        plan = plan_memory(config)
        model_dir = prepare_model_dir(config, Path(tmp) / "out")
        actor_world = config.resource.world_size_of("actor_rollout")
        if not config.resource.splits_rollout:
            measured = run_ranks(_rank_job, actor_world, full, str(model_dir), steps, timeout_s=1800)
            return plan, {plan.processes[0].roles: measured}
        # Each pool is a process group of its own (as on Ray); the pushes join them over the weight group,
        # whose store this process hosts for the two pools' processes.
        engines = config.resource.world_size_of("rollout")
        store = hosted_store("127.0.0.1", 1 + engines)
        port = store.port
        with ThreadPoolExecutor(2) as pool:
            pools = {
                role: pool.submit(
                    run_ranks,
                    job,
                    config.resource.world_size_of(role),
                    full,
                    str(model_dir),
                    steps,
                    port,
                    timeout_s=1800,
                )
                for role, job in (("actor_rollout", _split_actor_job), ("rollout", _split_engine_job))
            }
            return plan, {role: future.result() for role, future in pools.items()}


def _compare(name: str, plan: Any, measured: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    rows = []
    for process in plan.processes:
        ranks = measured[process.roles]
        print(
            f"\n{name}, {process.roles}: per-rank peak above the process baseline, MiB (larger rank, step 2)"
        )
        print(
            f"{'phase':<14} {'estimate':>9} {'live heap':>10} {'ratio':>6} {'resident':>9} {'ratio':>6}   "
            "estimated peak moment"
        )
        for estimate in process.phases:
            # A process idle in a phase holds what stays allocated after its last phase.
            key = estimate.phase if estimate.phase in ranks[0] else "generation"
            kind = "" if estimate.phase in ranks[0] else "/after"
            expected = estimate.total / MIB
            live = max(rank[key + kind][-1] for rank in ranks)
            resident = max(rank[f"{key}/resident"][-1] for rank in ranks) if not kind else float("nan")
            rows.append(
                {
                    "process": process.roles,
                    "phase": estimate.phase,
                    "moment": estimate.moment,
                    "estimate_mib": expected,
                    "live_mib": live,
                    "resident_mib": resident,
                }
            )
            print(
                f"{estimate.phase:<14} {expected:>9.1f} {live:>10.1f} {live / expected:>6.2f} {resident:>9.1f} "
                f"{resident / expected:>6.2f}   {estimate.moment}"
            )
        mine = [row for row in rows if row["process"] == process.roles]
        estimated_peak = max(mine, key=lambda r: r["estimate_mib"])
        live_peak = max(mine, key=lambda r: r["live_mib"])
        print(
            f"peak phase: estimated {estimated_peak['phase']} ({estimated_peak['estimate_mib']:.1f} MiB), "
            f"measured {live_peak['phase']} ({live_peak['live_mib']:.1f} MiB live heap)"
        )
    return {"config": name, "phases": rows, "raw": measured}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument(
        "--runtime", action="store_true", help="measure the vLLM engine's runtime memory instead"
    )
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    results = []
    if args.runtime:
        from trainer.plan import VLLM_CPU_RUNTIME_BYTES

        # After the first generation: the engine has allocated what it keeps between generations, and
        # the process holds the actor's shards and the engine's weights besides (no optimizer state yet).
        plan, measured = _measure(RUNTIME_CONFIG, steps=1)
        held = plan.processes[0].phases[0].components
        modelled = sum(held.get(key, 0) for key in ("actor params", "reference params", "engine weights"))
        for rank in measured[plan.processes[0].roles]:
            runtime = rank["generation/after"][0] - modelled / MIB
            print(
                f"engine runtime: {runtime:.1f} MiB (planner constant {VLLM_CPU_RUNTIME_BYTES / MIB:.1f} MiB)"
            )
            results.append({"runtime_mib": runtime, "raw": rank})
    for name in args.configs if not args.runtime else ():
        plan, measured = _measure(CONFIGS[name], steps=2)
        results.append(_compare(name, plan, measured))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
