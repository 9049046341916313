"""Training-layout mechanics shared by the roles that train an FSDP2 model (actor, critic).

Everything here runs inside a worker process on its local shard of a data-parallel batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

from hybridflow.parallel import agree_micro_batch_count, plan_micro_batches
from hybridflow.protocol import Batch
from workers.config import OptimConfig

__all__ = [
    "build_lr_scheduler",
    "build_optimizer",
    "global_sum",
    "micro_batches",
    "mini_batches",
    "sequence_inputs",
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


def global_sum(value: float | torch.Tensor) -> float:
    """Sum of ``value`` over all ranks of the default process group."""
    tensor = torch.as_tensor(value, dtype=torch.float64).reshape(1)
    if dist.is_initialized():
        if dist.get_backend() == "nccl":
            tensor = tensor.cuda()
        dist.all_reduce(tensor)
    return float(tensor.item())


def build_optimizer(model: nn.Module, config: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=config.lr,
        betas=config.betas,
        weight_decay=config.weight_decay,
    )


def build_lr_scheduler(optimizer: torch.optim.Optimizer, config: OptimConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, then constant, linear decay to 0, or cosine decay to ``min_lr_ratio``."""

    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        if config.schedule == "constant":
            return 1.0
        span = max(1, config.total_steps - config.warmup_steps)
        progress = min(1.0, (step - config.warmup_steps) / span)
        if config.schedule == "linear":
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
