"""`RolloutWorker`: the inference engine in a pool of its own (``resource.placement.rollout``).

Each rank holds one rollout engine (vLLM or HF), tensor-parallel within groups of ``rollout.tp_size``
ranks of the rollout pool, and no training state. Weights arrive over the weight group from the
actor's rank 0 (`workers.weight_push.WeightPushing`, `hybridflow.resharding.transport`); every push
carries a policy version, which the engine serves from then on and writes into each row it generates
(``policy_version``). Meshes published to the controller: ``"infer"`` (dp = world / tp).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import TypeVar

import torch
import torch.distributed as dist

from hybridflow.controller import DataParallel, Worker, register
from hybridflow.parallel import build_meshes
from hybridflow.protocol import Batch
from hybridflow.resharding.transport import BroadcastReceiver, open_weight_group
from hybridflow.rollout.base import RolloutEngine
from hybridflow.rollout.config import EngineDerived, RolloutConfig
from hybridflow.rollout.factory import build_rollout_engine
from hybridflow.rollout.sampling import SamplingParams

T = TypeVar("T")

__all__ = ["RolloutWorker"]


def _drained(head: list[T], rest: Iterator[T]) -> Iterator[T]:
    """The items of ``head``, taken out of it as they are yielded, then those of ``rest``: unlike
    ``itertools.chain(head, rest)``, nothing here keeps an item alive once the consumer lets go of it."""
    while head:
        yield head.pop(0)
    yield from rest


class RolloutWorker(Worker):
    """The engine side of a split rollout.

    Args:
        rollout: the ``rollout`` section (the engine).
        model_path: the policy's Hugging Face directory: the engine's weights until the first push
            (the trainer's version 0 comes from the same files).
        engine: the engine's dtype and ``max_model_len`` (`trainer.config.derive_values`).

    Attributes:
        policy_version: the version of the weights the engine serves (0: those of ``model_path``).

    The worker also counts the seconds its engine had no work (between the end of one call that
    generates or takes weights and the start of the next) and reports them with each generation as
    ``rollout/idle_s``.
    """

    def __init__(self, rollout: RolloutConfig, model_path: str, engine: EngineDerived) -> None:
        super().__init__()
        self.rollout_config = rollout
        self.model_path = model_path
        self.engine_derived = engine
        self.policy_version = 0
        self._idle_s = 0.0
        self._free_since = time.perf_counter()
        self.meshes = build_meshes(self.world_size, rollout.tp_size, self.device_plan.device_type)
        self.register_device_mesh("infer", self.meshes.infer, dp_dim="dp")

    @register(dispatch="one_to_all")
    def init_model(self) -> dict[str, float]:
        """Start the engine on the weights of ``model_path``."""
        start = time.perf_counter()
        self.engine = build_rollout_engine(
            self.rollout_config, self.model_path, self.engine_derived, device=self.device
        )
        self._free_since = time.perf_counter()  # idle from the moment the engine is ready
        return {"init/rollout_engine_s": self._free_since - start}

    def _start_work(self) -> float:
        """Count the seconds since the engine's last work ended as idle; returns now."""
        now = time.perf_counter()
        self._idle_s += now - self._free_since
        return now

    def _end_work(self) -> None:
        self._free_since = time.perf_counter()

    @register(dispatch="one_to_all", blocking=False)
    def join_weight_group(self, address: str, port: int, world_size: int) -> None:
        """Join the weight group as rank ``1 + rank`` (the actor's rank 0 is the sender)."""
        group = open_weight_group(address, port, 1 + self.rank, world_size, self.device)
        self.receiver = BroadcastReceiver(group, self.device)

    @register(dispatch="one_to_all", blocking=False)
    def receive_weights(self) -> dict[str, float]:
        """Take one push (or the sender's word that nothing changed) and serve its version.

        Returns ``rollout/policy_version`` and, when weights came, ``rollout/receive_s``.
        """
        start = self._start_work()
        weights = self.receiver.receive()
        head = list(itertools.islice(weights, 1))
        received = bool(head)
        if received:
            # Nothing here may keep the first tensor once the engine has loaded it: it is a view of its
            # bucket (the whole embedding when that travels alone), which would stand through the push.
            self.engine.update_weights(_drained(head, weights))
        assert self.receiver.version is not None
        self.policy_version = self.receiver.version
        metrics = {"rollout/policy_version": float(self.policy_version)}
        if received:
            metrics["rollout/receive_s"] = time.perf_counter() - start
        self._end_work()
        return metrics

    @register(dispatch="one_to_all")
    def served_version(self) -> int:
        """The policy version this rank's engine serves."""
        return self.policy_version

    def _sample(self, engine: RolloutEngine, prompts: Batch, sampling: SamplingParams) -> Batch:
        """The rollouts of `generate_sequences`: ``engine.generate``. A worker class overrides it for
        another kind of rollout, as it overrides the actor's `_sample` when the engine is colocated."""
        return engine.generate(prompts, sampling)

    @register(
        dispatch=DataParallel("infer"),
        reads=("input_ids", "attention_mask"),
        writes=("responses", "response_mask", "rollout_log_probs", "response_lengths", "policy_version"),
    )
    def generate_sequences(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """Sample ``sampling.n`` responses per prompt with the weights of ``policy_version``.

        Output: as `RolloutEngine.generate`, plus ``policy_version [rows]`` (int64) and
        ``meta["rollout_metrics"]``: ``timing_s/generate`` (the slowest rank's) and ``rollout/idle_s``
        (the seconds without work since the previous generation, pushes counting as work; the most
        idle rank's).
        """
        start = self._start_work()
        idle, self._idle_s = self._idle_s, 0.0
        rollouts = self._sample(self.engine, prompts, sampling)
        rows = len(rollouts)
        version = torch.full((rows,), self.policy_version, dtype=torch.int64)
        seconds = torch.tensor([time.perf_counter() - start, idle], dtype=torch.float64, device=self.device)
        if self.world_size > 1:
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        out = rollouts | Batch({"policy_version": version})
        out.meta.update(rollout_metrics={"timing_s/generate": float(seconds[0]), "rollout/idle_s": float(seconds[1])})
        self._end_work()
        return out

