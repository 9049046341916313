"""`ActorRolloutRefWorker`: policy training, generation and the reference policy in one process.

Each rank holds:

- the **actor**: the policy as an FSDP2 model over all ranks (the training layout), its AdamW
  optimizer and learning-rate schedule;
- the **rollout engine** (vLLM or HF), tensor-parallel within groups of ``rollout.tp_size``
  ranks (the inference layout);
- the **reference policy**: a second FSDP2 model, frozen, optionally kept in host memory between uses;
  with LoRA adapters on the actor (``actor.lora``), the actor itself with its adapters off instead (no
  second copy of the weights).

Generation always goes through the `ReshardingManager`, which streams the actor's current weights
into the engine and gives the memory back afterwards. With the rollout on a pool of its own
(``ActorDerived.rollout_split``) the processes hold no engine: `WeightPushing` broadcasts the weights
to the rollout pool's engines instead (docs/rollout_service.md). Two meshes are published to the controller:
``"world"`` (training: dp over all ranks) and ``"infer"`` (generation: dp = world / tp).
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from hybridflow.agents import (
    EPISODE_COLUMNS,
    AgentConfig,
    Codec,
    Environment,
    episode_metrics,
    episode_rows,
    episodes_to_batch,
    run_episodes,
)
from hybridflow.contract import (
    MODEL_INPUTS,
    loss_response_mask,
    loss_view,
    require_columns,
    sampled_response_mask,
)
from hybridflow.controller import DataParallel, Worker, register
from hybridflow.lora import (
    adapters_disabled,
    add_adapters,
    is_adapter_name,
    merge_adapters,
    save_peft_adapter,
)
from hybridflow.metrics import reduce_metrics
from hybridflow.models.io import load_causal_lm
from hybridflow.parallel import (
    VARLEN_SDPA,
    TokenLogProbs,
    TokenStatistic,
    accumulation_steps,
    build_meshes,
    load_fsdp_params,
    offload_fsdp_params,
    on_worker_device,
    packed_log_probs,
    padded_log_probs,
    reshard_all,
    resolve_token_statistics,
    shard_model,
    shared_prefix_log_probs,
)
from hybridflow.protocol import Batch
from hybridflow.resharding.manager import ReshardingConfig, ReshardingManager
from hybridflow.resharding.memory import keep_freed_host_memory, process_peak_memory_bytes
from hybridflow.rollout.base import RolloutEngine
from hybridflow.rollout.config import RolloutConfig
from hybridflow.rollout.factory import build_rollout_engine
from hybridflow.rollout.sampling import SamplingParams
from hybridflow.row_order import carries_advantage
from workers.config import ActorConfig, ActorDerived, RefConfig
from workers.objective import ActorLoss, skips_zero_advantage_rows
from workers.training import (
    LogProbGap,
    build_lr_scheduler,
    build_optimizer,
    clip_and_step,
    gather_full_state,
    global_max,
    global_sum,
    gradient_and_optimizer_bytes,
    load_training_state,
    micro_batches,
    mini_batches,
    save_training_state,
    sequence_inputs,
    update_micro_batches,
)
from workers.weight_push import WeightPushing

__all__ = ["ActorRolloutRefWorker", "sequence_log_probs"]


def sequence_log_probs(
    model: nn.Module,
    batch: Batch,
    *,
    temperature: float,
    use_packing: bool,
    chunk_size: int | None,
    stats: Sequence[str | TokenStatistic] = ("log_prob",),
) -> TokenLogProbs:
    """Token statistics of each response token, ``[batch, response_len]`` each: by default the log-prob
    (nats) alone; ``stats`` adds others (``entropy``, a recipe's own; `hybridflow.parallel.token_stats`).

    ``log_softmax(logits / temperature)`` at the sampled token: the distribution the rollout engine
    sampled from when top-k and top-p are off. Packed under the ``hybridflow_varlen_sdpa`` attention
    (the CPU default), each distinct prompt of the micro-batch runs once for all its responses
    (`shared_prefix_log_probs`).
    """
    if use_packing and getattr(model.config, "_attn_implementation", None) == VARLEN_SDPA:
        return shared_prefix_log_probs(
            model,
            batch["input_ids"],
            batch["attention_mask"],
            batch["responses"],
            batch["response_mask"],
            temperature=temperature,
            chunk_size=chunk_size,
            stats=stats,
        )
    input_ids, attention_mask = sequence_inputs(batch)
    forward = packed_log_probs if use_packing else padded_log_probs
    out = forward(model, input_ids, attention_mask, temperature=temperature, chunk_size=chunk_size, stats=stats)
    return out.response(batch["responses"].shape[1])



_AGENT_SUMS = (
    "tool_calls",
    "tool_errors",
    "tool_timeouts",
    "tool_seconds",
    "cut_max_turns",
    "cut_max_tokens",
    "drift_turns",
)
"""`episode_metrics` that count (episodes, calls, the calls' seconds): summed over the ranks."""


def _resolve_stats_argument(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Resolve ``stats`` names on the controller, where a recipe registered them (see `register`)."""
    if "stats" in kwargs:
        kwargs = {**kwargs, "stats": resolve_token_statistics(kwargs["stats"])}
    return args, kwargs


def _stat_column(name: str) -> str:
    """The output column of a token statistic: ``old_log_probs`` for the log-prob, else its own name."""
    return "old_log_probs" if name == "log_prob" else name


class ActorRolloutRefWorker(WeightPushing, Worker):
    """The policy in both layouts, plus the reference policy.

    Args:
        actor: the ``actor`` section (optimizer, batching, precision, offloading).
        ref: the ``ref`` section (its forwards' batching, host-memory offload between uses).
        rollout: the ``rollout`` section (the engine).
        resharding: the ``resharding`` section (bucket size, KV cache) of the layout switch.
        derived: the model directory, the default loss, the schedule's span, whether to hold the
            reference policy, the engine's dtype and length (``trainer.config.derive_values``).
    """

    def __init__(
        self,
        actor: ActorConfig,
        ref: RefConfig,
        rollout: RolloutConfig,
        resharding: ReshardingConfig,
        derived: ActorDerived,
    ) -> None:
        super().__init__()
        self.actor_config = actor
        self.ref_config = ref
        self.rollout_config = rollout
        self.resharding_config = resharding
        self.derived = derived
        self.with_ref = derived.with_ref
        self.lora = actor.lora
        self.offload_ref = ref.param_offload
        self.meshes = build_meshes(self.world_size, rollout.tp_size, self.device_plan.device_type)
        self.register_device_mesh("infer", self.meshes.infer, dp_dim="dp")
        self.update_steps = 0

    # ------------------------------------------------------------------ set-up

    def _load_sharded(self, trainable: bool) -> nn.Module:
        config = self.actor_config
        model = load_causal_lm(self.derived.model_path, getattr(torch, self.derived.dtype)).to(self.device)
        # Packed rows need per-sequence attention; plain sdpa would build a dense mask over all of
        # a micro-batch's tokens (measured 3.6x slower for the log-prob pass on a 25M model).
        model.set_attn_implementation(self.device_plan.attn_implementation(config.param_dtype))
        if trainable and config.lora is not None:
            # Only the adapters train; the base weights stay frozen (and get no gradient or optimizer state).
            add_adapters(model, config.lora)
        else:
            model.requires_grad_(trainable)
        return shard_model(
            model,
            self.meshes.train,
            mp_policy=self.device_plan.mixed_precision(config.param_dtype),
            activation_checkpointing=config.activation_checkpointing and trainable,
        )

    @register(dispatch="one_to_all")
    def init_model(self) -> dict[str, float]:
        """Load and shard the actor (and reference), build the optimizer and the rollout engine.

        With ``actor.lora`` the actor carries adapters, the optimizer holds them alone, no reference model
        is loaded (the reference is the actor with its adapters off) and the engine holds the same
        adapters when ``actor.lora.push`` is ``adapters``."""
        start = time.perf_counter()
        if self.actor_config.keep_freed_host_memory and not keep_freed_host_memory():
            raise RuntimeError("actor.keep_freed_host_memory is true, but this C library has no glibc mallopt")
        self.model = self._load_sharded(trainable=True)
        self.optimizer = build_optimizer(self.model, self.actor_config)
        self.scheduler = build_lr_scheduler(self.optimizer, self.actor_config, self.derived.optimizer_steps)
        separate_ref = self.with_ref and self.lora is None
        self.ref_model = self._load_sharded(trainable=False) if separate_ref else None
        if self.ref_model is not None and self.offload_ref:
            offload_fsdp_params(self.ref_model)
        loaded = time.perf_counter()
        if self.derived.rollout_split:
            # The engines live in the rollout pool; the weight group's sender feeds them (`WeightPushing`).
            return {"init/load_s": loaded - start}
        engine = self.derived.engine
        engine_lora = self.lora if self.lora is not None and self.lora.push == "adapters" else None
        self.engine = build_rollout_engine(
            self.rollout_config, self.derived.model_path, engine, device=self.device, lora=engine_lora
        )
        # The manager starts in the training layout: the engine's cache is given back until needed.
        if self.resharding_config.free_kv_cache:
            self.engine.release()
        self.resharder = ReshardingManager(
            self.model,
            self.engine,
            self.optimizer,
            self.resharding_config,
            self.device,
            offload_params=self.actor_config.param_offload,
            offload_optimizer=self.actor_config.optimizer_offload,
            weight_dtype=getattr(torch, engine.dtype),
            lora=self.lora,
        )
        return {"init/load_s": loaded - start, "init/engine_s": time.perf_counter() - loaded}

    # ------------------------------------------------------------------ generation

    @register(
        dispatch=DataParallel("infer"),
        reads=("input_ids", "attention_mask"),
        writes=("responses", "response_mask", "rollout_log_probs", "response_lengths"),
    )
    def generate_sequences(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """Sample ``sampling.n`` responses per prompt with the actor's current weights.

        Input: ``input_ids``/``attention_mask [batch, prompt_len]`` (left-padded). Output: see
        `RolloutEngine.generate`; ``meta["rollout_metrics"]`` carries the timing and peak memory of both
        layout switches, reduced over all ranks (the slowest rank's seconds, the largest rank's memory).
        """
        self.require_colocated_engine("generate_sequences")
        start = time.perf_counter()
        with self.resharder as engine:
            generated = time.perf_counter()
            rollouts = self._sample(engine, prompts, sampling)
            generate_s = time.perf_counter() - generated
        to_inference, to_training = self.resharder.reports[-2:]
        local = {
            **to_inference.metrics(),
            **to_training.metrics(),
            "timing_s/generate": generate_s,
            "timing_s/generate_with_resharding": time.perf_counter() - start,
        }
        per_rank: list[dict[str, float]] = [{}] * self.world_size
        dist.all_gather_object(per_rank, local)
        rollouts.meta.update(rollout_metrics=reduce_metrics(per_rank, {"resharding/*": "max"}))
        return rollouts

    @register(
        dispatch=DataParallel("infer"),
        reads=("input_ids", "attention_mask"),
        writes=("responses", "response_mask", "rollout_log_probs", "response_lengths", *EPISODE_COLUMNS),
    )
    def generate_episodes(
        self,
        prompts: Batch,
        sampling: SamplingParams,
        agent: AgentConfig,
        make_environment: Callable[[], Environment],
        codec: Codec,
    ) -> Batch:
        """Run ``sampling.n`` episodes per prompt with the actor's current weights (docs/agents.md).

        Each episode starts from the prompt's ids (`episode_rows`; the prompt Batch's non-tensor columns
        reach the environment's ``start``), each turn sampled with ``sampling`` (``n`` 1, at most
        ``max_new_tokens`` ids). ``make_environment`` builds one episode's environment (resolved on the
        controller, where a recipe registered it). Output: `episodes_to_batch` with the prompt width of
        ``prompts`` and ``agent.max_total_tokens`` response columns, so the ranks' Batches concatenate;
        ``meta["rollout_metrics"]`` as in `generate_sequences`, plus the ``agent/*`` metrics of
        `episode_metrics` (counts summed over ranks, the rest averaged, maxima and seconds the largest).
        """
        self.require_colocated_engine("generate_episodes")
        start = time.perf_counter()
        with self.resharder as engine:
            generated = time.perf_counter()
            rows = episode_rows(prompts, sampling.n)
            turn = dataclasses.replace(sampling, n=1)
            rollout = run_episodes(engine, rows, make_environment, codec, turn, agent)
            generate_s = time.perf_counter() - generated
        episodes = episodes_to_batch(
            rollout,
            engine.pad_token_id,
            response_width=agent.max_total_tokens,
            prompt_width=prompts["input_ids"].shape[1],
        )
        to_inference, to_training = self.resharder.reports[-2:]
        local = {
            **to_inference.metrics(),
            **to_training.metrics(),
            **episode_metrics(rollout),
            "timing_s/generate": generate_s,
            "timing_s/generate_with_resharding": time.perf_counter() - start,
        }
        per_rank: list[dict[str, float]] = [{}] * self.world_size
        dist.all_gather_object(per_rank, local)
        kinds = {**{f"agent/{name}": "sum" for name in _AGENT_SUMS}, "resharding/*": "max", "agent/*_seconds": "max"}
        episodes.meta.update(rollout_metrics=reduce_metrics(per_rank, kinds))
        return episodes

    def _sample(self, engine: RolloutEngine, prompts: Batch, sampling: SamplingParams) -> Batch:
        """The rollouts of `generate_sequences`, drawn from ``engine`` in the inference layout:
        ``engine.generate``. A recipe's worker class overrides it for a new kind of rollout (soft
        embedding inputs, say); the layout switches and their metrics stay `generate_sequences`'s."""
        return engine.generate(prompts, sampling)

    # ------------------------------------------------------------------ log-probs

    def _token_stats(
        self,
        model: nn.Module,
        batch: Batch,
        temperature: float,
        stats: Sequence[str | TokenStatistic],
        rows: int,
        max_tokens: int | None,
    ) -> TokenLogProbs:
        """``stats`` of ``model`` over ``batch`` in micro-batches of ``rows`` rows, or of at most
        ``max_tokens`` valid tokens when that is set."""
        parts, restore = micro_batches(batch, rows, max_tokens)
        outs = [self._sequence_stats(model, part, temperature, stats) for part in parts]
        return TokenLogProbs({name: torch.cat([o.values[name] for o in outs])[restore] for name in outs[0].values})

    def _sequence_stats(
        self, model: nn.Module, batch: Batch, temperature: float, stats: Sequence[str | TokenStatistic]
    ) -> TokenLogProbs:
        """Token statistics of one micro-batch's responses, ``[micro_batch, response_len]`` each
        (`sequence_log_probs`): every training-layout forward of the actor and the reference goes through
        here, so a recipe's worker class can override it for sequences that are not plain token ids. In
        `update_actor` the micro-batch also carries ``advantages``."""
        config = self.actor_config
        return sequence_log_probs(
            model,
            batch,
            temperature=temperature,
            use_packing=config.use_packing,
            chunk_size=config.logit_chunk_size,
            stats=stats,
        )

    @register(
        dispatch=DataParallel(),
        reads=MODEL_INPUTS,
        writes=("old_log_probs",),
        prepare=_resolve_stats_argument,
    )
    @on_worker_device
    def compute_log_prob(
        self, batch: Batch, *, temperature: float, stats: Sequence[str | TokenStatistic] = ("log_prob",)
    ) -> Batch:
        """Token statistics of the current actor, in the training layout, each ``[batch, response_len]``.

        ``temperature`` is the one the responses were sampled with. ``stats`` names registered token
        statistics (`hybridflow.parallel.token_stats`), computed in logit chunks in one forward:
        ``log_prob`` becomes the ``old_log_probs`` column (nats) and is always computed; any other
        statistic becomes a column of its own name (``entropy``, ``self_certainty``, a recipe's own).
        Names registered only in the controller reach the workers: they are resolved there.
        """
        names = [s if isinstance(s, str) else s.name for s in stats]
        if "log_prob" not in names:
            stats = (*resolve_token_statistics(["log_prob"]), *stats)
        if self.lora is not None:
            # Adapter dropout is for the update only; these log-probs are the deterministic policy's.
            self.model.eval()
        with torch.no_grad():
            config = self.actor_config
            out = self._token_stats(
                self.model, batch, temperature, stats, config.forward_micro_batch_size, config.token_budget
            )
        reshard_all(self.model)
        return Batch({_stat_column(name): value for name, value in out.values.items()})

    @register(dispatch=DataParallel(), reads=MODEL_INPUTS, writes=("ref_log_probs",))
    @on_worker_device
    def compute_ref_log_prob(self, batch: Batch, *, temperature: float) -> Batch:
        """``ref_log_probs [batch, response_len]`` (nats) under the frozen reference policy, at the
        sampling ``temperature``: with ``actor.lora``, one forward of the actor with its adapters off."""
        if not self.with_ref:
            raise RuntimeError("this worker was built with with_ref=False")
        if self.lora is not None:
            self.model.eval()
            with torch.no_grad(), adapters_disabled(self.model):
                out = self._token_stats(
                    self.model,
                    batch,
                    temperature,
                    ("log_prob",),
                    self.ref_config.forward_micro_batch_size,
                    self.ref_config.token_budget,
                )
            reshard_all(self.model)
            return Batch({"ref_log_probs": out.log_probs})
        assert self.ref_model is not None
        if self.offload_ref:
            load_fsdp_params(self.ref_model, self.device)
        with torch.no_grad():
            out = self._token_stats(
                self.ref_model,
                batch,
                temperature,
                ("log_prob",),
                self.ref_config.forward_micro_batch_size,
                self.ref_config.token_budget,
            )
        reshard_all(self.ref_model)
        if self.offload_ref:
            offload_fsdp_params(self.ref_model)
        return Batch({"ref_log_probs": out.log_probs})

    # ------------------------------------------------------------------ training

    @register(dispatch=DataParallel(allow_padding=False), reads=(*MODEL_INPUTS, "advantages"))
    @on_worker_device
    def update_actor(
        self, batch: Batch, *, temperature: float, loss_fn: ActorLoss | None = None
    ) -> dict[str, float]:
        """Train on one step's rollouts: ``epochs`` passes of mini-batches, each an optimizer step.

        ``batch`` needs ``input_ids``, ``attention_mask``, ``responses``, ``response_mask``,
        ``advantages`` (and ``ref_log_probs`` for a KL loss) and usually ``old_log_probs``, and every
        column ``loss_fn.reads`` declares. An optional ``loss_mask [batch, response_len]`` (per-token
        loss weights >= 0; 0/1 is a mask) is multiplied into the ``response_mask`` every loss term sees,
        and the token counts count the tokens of non-zero weight; the forward uses the real one
        (`hybridflow.contract.loss_response_mask`).
        ``temperature`` is the one the responses were sampled with.
        ``loss_fn`` defaults to the run's `PolicyObjective` (``ActorDerived.objective``). Each
        micro-batch's loss is normalised by the global mini-batch token and row counts, so the update
        does not depend on the micro-batch size or the number of ranks. Returns metrics averaged over
        mini-batches.

        **Zero-advantage rows.** When `skips_zero_advantage_rows` holds for ``loss_fn`` (by default
        wherever it is exact: ``actor.skip_zero_advantage_rows``), rows whose advantage is zero at every
        valid token are left out of the forward and backward; the normalisers keep the full mini-batch's
        counts, so the gradient is the same. ``actor/rows_skipped`` counts them (over all ranks, once per
        update), and the loss's per-token metrics average over the rows that entered the update. A
        mini-batch left with no row on any rank still takes its optimizer step, on the exact zero
        gradient of one prompt-only row per rank (`update_micro_batches`).

        **On-policy shortcut.** Without ``old_log_probs``, the update must be a single optimizer step
        (one epoch, one mini-batch): the policy that sampled is then the policy being updated, so the
        old log-probs are this forward's own, detached (ratio exactly 1), and a separate
        `compute_log_prob` pass is saved. With ``rollout_log_probs`` in the batch, the
        rollout-vs-trainer gap (``sync/log_prob_abs_diff_mean``, ``_max``) is then measured here.
        """
        config = self.actor_config
        if loss_fn is None:
            # Resolved on the controller: a recipe's registered functions came with it.
            loss_fn = self.derived.objective
        on_policy = "old_log_probs" not in batch
        require_columns(batch, [c for c in loss_fn.reads if c != "old_log_probs"], "update_actor's loss_fn")
        if on_policy and (config.ppo_epochs != 1 or config.ppo_mini_batch_size < len(batch) * self.world_size):
            raise ValueError(
                "update_actor: the batch has no old_log_probs, which is only valid for one on-policy "
                f"optimizer step, but actor.ppo_epochs={config.ppo_epochs} and actor.ppo_mini_batch_size="
                f"{config.ppo_mini_batch_size} < {len(batch) * self.world_size} rows; run compute_log_prob first"
            )
        skip = skips_zero_advantage_rows(config.skip_zero_advantage_rows, loss_fn)
        self.model.train()
        totals: dict[str, float] = defaultdict(float)
        steps = 0
        for epoch in range(config.ppo_epochs):
            seed = self.derived.seed + 1000 * self.update_steps + epoch
            for mini in mini_batches(batch, config.ppo_mini_batch_size, self.world_size, config.shuffle, seed):
                for key, value in self._train_mini_batch(mini, loss_fn, temperature, on_policy, skip).items():
                    totals[key] += value
                steps += 1
        self.update_steps += 1
        reshard_all(self.model)
        metrics = {key: value / steps for key, value in totals.items()}
        if skip:
            metrics["actor/rows_skipped"] = global_sum((~carries_advantage(batch)).sum())
        # Largest rank: what decides whether a run fits.
        held = gradient_and_optimizer_bytes(self.model, self.optimizer)
        metrics["memory/actor_grad_optimizer_mb"] = global_max(held) / 2**20
        metrics["memory/actor_process_peak_mb"] = global_max(process_peak_memory_bytes(self.device)) / 2**20
        return metrics

    def _train_mini_batch(
        self, mini: Batch, loss_fn: ActorLoss, temperature: float, on_policy: bool, skip: bool
    ) -> dict[str, float]:
        config = self.actor_config
        # Tokens of non-zero loss weight, each counted once: a weight scales a token's term, not the count.
        mask = loss_response_mask(mini).bool()
        # The full mini-batch's counts, also when rows are left out: the loss shares stay the same.
        global_tokens = global_sum(mask.sum())
        global_seqs = global_sum(len(mini))
        keep = carries_advantage(mini) if skip else torch.ones(len(mini), dtype=torch.bool, device=mask.device)
        counts = {"metric_tokens": global_sum(mask[keep].sum())} if skip else {}
        parts = update_micro_batches(mini, keep, config.ppo_micro_batch_size, config.token_budget)
        self.optimizer.zero_grad(set_to_none=True)
        local: dict[str, float] = defaultdict(float)
        gap = LogProbGap()
        for part in accumulation_steps(self.model, parts, config.gather_once_per_mini_batch):
            stats = ("log_prob", "entropy") if loss_fn.needs_entropy else ("log_prob",)
            out = self._sequence_stats(self.model, part, temperature, stats)
            if on_policy:
                part = part | Batch({"old_log_probs": out.log_probs.detach()})
                if "rollout_log_probs" in part:
                    # Over the sampled tokens only: inserted ids have no engine log-prob.
                    gap.add(part["rollout_log_probs"], part["old_log_probs"], sampled_response_mask(part))
            # The forward ran on the real response mask; the loss weighs its tokens by the loss mask.
            loss, metrics = loss_fn(out.log_probs, out.entropy, loss_view(part), global_tokens, global_seqs, **counts)
            # FSDP2 averages gradients over ranks; the loss shares are meant to be summed.
            (loss * self.world_size).backward()
            for key, value in metrics.items():
                local[key] += value
        grad_norm, lr = clip_and_step(self.model, self.optimizer, self.scheduler, config.grad_clip)
        metrics = {key: global_sum(value) for key, value in sorted(local.items())}
        metrics.update({"actor/grad_norm": grad_norm, "actor/lr": lr})
        if on_policy and "rollout_log_probs" in mini:
            metrics.update(gap.global_metrics())
        return metrics

    @register(dispatch="one_to_all")
    def gather_full_state(self) -> dict[str, torch.Tensor] | None:
        """The actor's full weights under Hugging Face names, on rank 0 (``None`` elsewhere).

        A collective that gathers one parameter at a time; for inspection and small models.
        """
        return gather_full_state(self.model, self.rank)

    # ------------------------------------------------------------------ checkpoints

    @register(dispatch="one_to_all")
    def save_checkpoint(self, directory: str, export_hf: bool = False) -> None:
        """Write a distributed checkpoint (model + optimizer shards, schedule, step count) under
        ``directory``; with ``export_hf`` also a Hugging Face model directory in ``directory/hf``.

        With ``actor.lora`` the checkpoint holds the adapters and their optimizer state alone (the base
        weights are ``model.path``'s, unchanged), and the export writes the merged model to
        ``directory/hf`` and a PEFT adapter directory to ``directory/adapter``."""
        path = Path(directory)
        trainable_only = self.lora is not None
        save_training_state(
            path, "actor", self.model, self.optimizer, self.scheduler, self.update_steps, self.rank, trainable_only
        )
        if export_hf:
            self._export_hf(path / "hf", path / "adapter")
            dist.barrier()

    @register(dispatch="one_to_all")
    def load_checkpoint(self, directory: str) -> None:
        """Restore what `save_checkpoint` wrote (the model must be initialised first)."""
        self.update_steps = load_training_state(
            Path(directory), "actor", self.model, self.optimizer, self.scheduler, self.lora is not None
        )

    def _export_hf(self, target: Path, adapter_target: Path) -> None:
        full = self.gather_full_state()
        if full is None:
            return
        source = self.derived.model_path
        if self.lora is not None:
            adapters = {name: tensor for name, tensor in full.items() if is_adapter_name(name)}
            save_peft_adapter(adapter_target, adapters, self.lora, source)
            full = dict(merge_adapters(full.items(), self.lora.scaling))
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source))
        model.load_state_dict(full)
        target.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(target, safe_serialization=True)
        AutoTokenizer.from_pretrained(source).save_pretrained(target)
