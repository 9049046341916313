"""Training-layout mechanics shared by the roles that train an FSDP2 model (actor, critic).

Everything here runs inside a worker process on its local shard of a data-parallel batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from hybridflow.parallel import (
    agree_micro_batch_count,
    iter_full_state,
    local_bytes,
    plan_micro_batches,
    process_group_device_plan,
)
from hybridflow.protocol import Batch
from workers.config import OptimizedRoleConfig

__all__ = [
    "LogProbGap",
    "build_lr_scheduler",
    "build_optimizer",
    "clip_and_step",
    "gather_full_state",
    "global_max",
    "global_sum",
    "gradient_and_optimizer_bytes",
    "load_training_state",
    "micro_batches",
    "mini_batches",
    "save_training_state",
    "sequence_inputs",
    "update_micro_batches",
]


def sequence_inputs(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt and response joined: ``input_ids, attention_mask [batch, prompt_len + response_len]``.

    Prompts are left-padded (``input_ids``, ``attention_mask``) and responses right-padded
    (``responses``, ``response_mask``), so the valid tokens of each row form one contiguous run.
    """
    input_ids = torch.cat([batch["input_ids"], batch["responses"]], dim=1)
    attention_mask = torch.cat([batch["attention_mask"], batch["response_mask"]], dim=1)
    return input_ids, attention_mask


def micro_batches(
    batch: Batch, micro_batch_size: int, max_tokens: int | None
) -> tuple[list[Batch], torch.Tensor]:
    """Split this rank's rows into micro-batches; every rank gets the same number of them.

    With ``max_tokens`` the split is by valid tokens (dynamic micro-batching, balanced), otherwise by
    ``micro_batch_size`` rows. FSDP2 runs collectives in every forward, so ranks agree on the count.

    Returns:
        the micro-batches, and ``restore [batch]``: the index that puts rows concatenated in
        micro-batch order back in the batch's order.
    """
    if max_tokens is not None:
        counts = sequence_inputs(batch)[1].sum(dim=1)
        plan = plan_micro_batches(counts, max_tokens)
        count = agree_micro_batch_count(len(plan.micro_batches))
        plan = plan_micro_batches(counts, max_tokens, min_micro_batches=count)
        return [batch.reorder(rows) for rows in plan.micro_batches], plan.restore
    count = agree_micro_batch_count(math.ceil(len(batch) / micro_batch_size))
    size = math.ceil(len(batch) / count)
    return batch.chunk(size), torch.arange(len(batch))


def update_micro_batches(
    batch: Batch, keep: torch.Tensor, micro_batch_size: int, max_tokens: int | None
) -> list[Batch]:
    """This rank's micro-batches for one gradient step over the rows of ``batch`` where ``keep
    [batch]`` is true; every rank gets the same number of them (a collective).

    The count is the largest any rank needs for its kept rows (``micro_batch_size`` rows, or
    ``max_tokens`` valid tokens, per micro-batch), and at least 1; each micro-batch holds at least one
    row, since FSDP2 runs collectives in every forward and backward. A rank with fewer kept rows than
    that count borrows left-out rows, shortest prompts first, with their ``response_mask`` zeroed: they
    run through the model (prompt tokens only) but add nothing to a masked loss, its gradient or its
    metrics. When no rank kept a row, each runs one borrowed row: the optimizer step then sees the
    exact zero gradient of the full update, and the loss reports its value, 0.
    """
    # Row indices live on the CPU (`Batch.reorder` reads them with numpy); the columns may not.
    keep = keep.cpu()
    kept = keep.nonzero().squeeze(-1)
    tokens = sequence_inputs(batch)[1].sum(dim=1).cpu()
    if not len(kept):
        local = 0
    elif max_tokens is not None:
        local = len(plan_micro_batches(tokens[kept], max_tokens).micro_batches)
    else:
        local = math.ceil(len(kept) / micro_batch_size)
    count = max(agree_micro_batch_count(local), 1)
    left_out = (~keep).nonzero().squeeze(-1)
    prompt_tokens = batch["attention_mask"].sum(dim=1).cpu()
    borrowed = left_out[prompt_tokens[left_out].argsort(stable=True)][: max(count - len(kept), 0)]
    rows = batch.reorder(torch.cat([kept, borrowed]))
    if len(borrowed):
        # ``reorder`` copied the rows: zeroing the borrowed ones leaves ``batch`` as it was.
        response_mask = rows.pop("response_mask")["response_mask"]
        response_mask[len(kept) :] = 0
        rows = rows | Batch({"response_mask": response_mask})
    if max_tokens is None:
        return [rows.reorder(index) for index in torch.arange(len(rows)).tensor_split(count)]
    plan = plan_micro_batches(sequence_inputs(rows)[1].sum(dim=1), max_tokens, min_micro_batches=count)
    return [rows.reorder(index) for index in plan.micro_batches]


def _all_reduce(value: float | torch.Tensor, op: dist.ReduceOp.RedOpType) -> float:
    device = process_group_device_plan().device
    tensor = torch.as_tensor(value, dtype=torch.float64, device=device).reshape(1)
    if dist.is_initialized():
        dist.all_reduce(tensor, op=op)
    return float(tensor.item())


def global_sum(value: float | torch.Tensor) -> float:
    """Sum of ``value`` over all ranks of the default process group."""
    return _all_reduce(value, dist.ReduceOp.SUM)


def global_max(value: float | torch.Tensor) -> float:
    """Largest ``value`` over all ranks of the default process group."""
    return _all_reduce(value, dist.ReduceOp.MAX)


def gradient_and_optimizer_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes this rank holds in gradients and optimizer state: the local shard of every ``.grad`` and
    of every tensor in ``optimizer.state`` (AdamW: two moments and a step per trained parameter).

    The memory that LoRA saves: only trained parameters have either.
    """
    grads = sum(local_bytes(p.grad) for p in model.parameters() if p.grad is not None)
    state = sum(
        local_bytes(value)
        for per_param in optimizer.state.values()
        for value in per_param.values()
        if isinstance(value, torch.Tensor)
    )
    return grads + state


class LogProbGap:
    """|rollout log-prob - trainer log-prob| over response tokens, accumulated over micro-batches and
    reduced over ranks into the ``sync/log_prob_abs_diff_mean`` and ``_max`` metrics (nats)."""

    def __init__(self) -> None:
        self._sum = self._count = 0.0
        self._max = 0.0

    def add(self, rollout: torch.Tensor, trained: torch.Tensor, mask: torch.Tensor) -> None:
        """Fold in one micro-batch; all three are ``[micro_batch, response_len]``."""
        gap = (rollout.double() - trained.detach().double()).abs()[mask.bool()]
        if gap.numel():
            self._sum += gap.sum().item()
            self._count += gap.numel()
            self._max = max(self._max, gap.max().item())

    def global_metrics(self) -> dict[str, float]:
        """The metrics over every rank (a collective: all ranks must call it); none when no rank saw a
        token (every row was left out of the update)."""
        count = global_sum(self._count)
        if not count:
            return {}
        return {
            "sync/log_prob_abs_diff_mean": global_sum(self._sum) / max(count, 1.0),
            "sync/log_prob_abs_diff_max": global_max(self._max),
        }


def build_optimizer(model: nn.Module, config: OptimizedRoleConfig) -> torch.optim.Optimizer:
    """AdamW over ``model``'s trainable parameters with the role's ``lr``, ``betas`` and ``weight_decay``."""
    params = [p for p in model.parameters() if p.requires_grad]
    # On CPU torch's default is its per-tensor Python loop; the fused kernel computes the same update
    # (a demo-shaped update: 0.274 s -> 0.254 s, weights equal to 1e-6 after 8 steps). On GPU the
    # default (foreach) stays.
    on_cpu = all(p.device.type == "cpu" for p in params)
    return torch.optim.AdamW(
        params,
        lr=config.lr,
        betas=tuple(config.betas),
        weight_decay=config.weight_decay,
        fused=True if on_cpu else None,
    )


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, config: OptimizedRoleConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """``config.warmup_steps`` of linear warm-up, then ``config.lr_scheduler``: constant, linear decay
    to 0, or cosine decay to ``min_lr_ratio``, over ``total_steps`` optimizer steps in all."""

    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        if config.lr_scheduler == "constant":
            return 1.0
        span = max(1, total_steps - config.warmup_steps)
        progress = min(1.0, (step - config.warmup_steps) / span)
        if config.lr_scheduler == "linear":
            return 1.0 - progress
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * cosine

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def mini_batches(batch: Batch, global_size: int, world_size: int, shuffle: bool, seed: int) -> Iterator[Batch]:
    """This rank's share of each global mini-batch of ``global_size`` rows."""
    local = global_size // world_size
    if local < 1 or global_size % world_size:
        raise ValueError(f"mini_batch_size {global_size} must be a positive multiple of the world size {world_size}")
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    yield from batch.iter_minibatches(local, shuffle=shuffle, generator=generator)


def clip_and_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    grad_clip: float | None,
) -> tuple[float, float]:
    """Clip the global gradient norm (``grad_clip`` None: report it only), step the optimizer and the
    schedule. Returns the norm before clipping and the learning rate the step used."""
    max_norm = float("inf") if grad_clip is None else grad_clip
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    # Under FSDP2 the norm is a DTensor; its full value is the global norm.
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
    lr = scheduler.get_last_lr()[0]
    optimizer.step()
    scheduler.step()
    return float(grad_norm), lr


def gather_full_state(model: nn.Module, rank: int) -> dict[str, torch.Tensor] | None:
    """Full weights under their Hugging Face names on rank 0 (``None`` elsewhere); a collective that
    gathers one parameter at a time."""
    full = {}
    for name, tensor in iter_full_state(model):
        if rank == 0:
            full[name] = tensor.detach().cpu().clone()
    return full if rank == 0 else None


def save_training_state(
    directory: Path,
    prefix: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    update_steps: int,
    rank: int,
    trainable_only: bool = False,
) -> None:
    """Write ``{prefix}_dcp`` (model and optimizer shards, a torch distributed checkpoint) and
    ``{prefix}_state.pt`` (schedule, step count) under ``directory``; a collective. ``trainable_only``
    leaves the frozen parameters out (a LoRA actor's base weights)."""
    options = StateDictOptions(ignore_frozen_params=trainable_only)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(directory / f"{prefix}_dcp"))
    if rank == 0:
        torch.save(
            {"scheduler": scheduler.state_dict(), "update_steps": update_steps}, directory / f"{prefix}_state.pt"
        )
    dist.barrier()


def load_training_state(
    directory: Path,
    prefix: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    trainable_only: bool = False,
) -> int:
    """Restore what `save_training_state` wrote into the live (sharded) objects; returns the step count.
    ``trainable_only`` as it was saved: the frozen parameters keep the values they were loaded with.

    The optimizer's settings stay those of the config that built ``optimizer`` and ``scheduler``: the
    weights, the optimizer's moments and step count and the schedule's position come from the
    checkpoint, while the learning rate (and the schedule applied to it), betas and weight decay are
    the config's, so a run resumed with an edited ``lr`` trains at it (`trainer.run_folder` warns).
    """
    configured = [{key: group[key] for key in _CONFIGURED_SETTINGS} for group in optimizer.param_groups]
    base_lrs = list(scheduler.base_lrs)
    options = StateDictOptions(ignore_frozen_params=trainable_only)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(directory / f"{prefix}_dcp"))
    # The frozen parameters are absent from a trainable-only checkpoint, so the load cannot be strict.
    options = StateDictOptions(ignore_frozen_params=trainable_only, strict=not trainable_only)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options
    )
    saved = torch.load(directory / f"{prefix}_state.pt", weights_only=False)
    scheduler.load_state_dict(saved["scheduler"])
    for group, settings, base_lr in zip(optimizer.param_groups, configured, base_lrs, strict=True):
        group.update(settings, initial_lr=base_lr)
    scheduler.base_lrs = base_lrs
    # Recompute the current learning rate from the config's base at the loaded position: step back one
    # and step again (with an unchanged config this is the saved value, bit for bit).
    scheduler.last_epoch -= 1
    scheduler.step()
    return saved["update_steps"]


_CONFIGURED_SETTINGS = ("betas", "weight_decay")
"""Optimizer param-group settings besides the learning rate that the config decides on resume."""
