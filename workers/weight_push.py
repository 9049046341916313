"""`WeightPushing`: the training side of a rollout pool of its own (``resource.placement.rollout``).

With the rollout split off, the actor's processes hold no engine. Their `ReshardingManager` streams
into a `BroadcastSender` instead: every training rank all-gathers each FSDP2 parameter as it does for
a colocated engine, and rank 0 broadcasts the full weights in buckets over the weight group to every
engine of the rollout pool (`workers.rollout.RolloutWorker`). The policy version of a push is the
number of actor updates so far (``update_steps``, restored with a checkpoint).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from hybridflow.controller import register
from hybridflow.parallel.rendezvous import hosted_store
from hybridflow.resharding.manager import ReshardingManager
from hybridflow.resharding.transport import BroadcastSender, open_weight_group

__all__ = ["WeightPushing"]


class WeightPushing:
    """Methods of `ActorRolloutRefWorker` for a split rollout; they use the actor's ``model``,
    ``optimizer``, ``resharding_config``, ``derived`` (the engine's dtype), ``actor_config`` (its LoRA
    adapters, pushed merged), ``update_steps`` and the worker's ``rank`` and ``device``."""

    _pushed_version: int | None = None
    _weight_store: dist.TCPStore | None = None  # the weight group's store, once rank 0 hosts it

    def require_colocated_engine(self, method: str) -> None:
        """Refuse ``method`` where the engines live in the rollout pool (a push there would wait on
        engines that are not listening)."""
        if self.derived.rollout_split:
            raise RuntimeError(
                f"{method}: the rollout runs on a pool of its own (resource.placement.rollout); "
                "generate through runtime.rollout (trainer.steps.generate)"
            )

    @register(dispatch="one_to_all", execute="rank_zero")
    def weight_group_address(self, world_size: int) -> tuple[str, int]:
        """Start the weight group's store on this rank (rank 0) and return where it listens: this node's
        address and the port the store bound."""
        self._weight_store = hosted_store(self.master_addr, world_size)
        return self.master_addr, self._weight_store.port

    @register(dispatch="one_to_all", blocking=False)
    def join_weight_group(self, address: str, port: int, world_size: int) -> None:
        """Rank 0 joins the weight group as its sender (group rank 0), on the store it hosts
        (`weight_group_address`) or else the one at ``address:port``; every rank builds the manager
        that streams into it (the others take part in its all-gathers only)."""
        group = (
            open_weight_group(address, port, 0, world_size, self.device, hosted=self._weight_store)
            if self.rank == 0
            else None
        )
        self.weight_sender = BroadcastSender(group, self.resharding_config.bucket_bytes, self.device)
        self.resharder = ReshardingManager(
            self.model,
            self.weight_sender,
            self.optimizer,
            self.resharding_config,
            self.device,
            weight_dtype=getattr(torch, self.derived.engine.dtype),
            lora=self.actor_config.lora,
        )

    @register(dispatch="one_to_all", execute="rank_zero")
    def policy_version(self) -> int:
        """The trainer's policy version: the actor updates so far (``update_steps``)."""
        return self.update_steps

    @register(dispatch="one_to_all", blocking=False)
    def push_weights(self) -> dict[str, float]:
        """Broadcast the current weights under version ``update_steps`` if the engines do not serve it
        yet; else only tell them the version. Returns ``weight_push/*`` (rank 0's; the others' empty)."""
        version = self.update_steps
        self.weight_sender.version = version
        if version == self._pushed_version:
            self.weight_sender.send_unchanged()
            return {}
        start = time.perf_counter()
        self.resharder.to_inference()
        self.resharder.to_training()
        self._pushed_version = version
        if self.rank != 0:
            return {}
        report = self.weight_sender.reports[-1]
        return {**report.metrics(), "weight_push/total_s": time.perf_counter() - start}
