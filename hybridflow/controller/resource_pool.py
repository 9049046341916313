"""`ResourcePool`: device slots reserved on a Ray cluster as placement groups.

A pool holds one placement group per node, with one bundle per device slot: ``{"CPU": c}`` on CPU
machines, ``{"CPU": c, "GPU": 1}`` on GPU machines, plus any custom Ray resources the pool asks each
slot for (``{"rollout_node": 1}``: only nodes started with that resource can hold it, which is how a
pool is pinned to nodes of a multi-node cluster). Every process that serves a slot is placed in
that slot's bundle. When several separate processes must share a slot (roles that are not
colocated in one process but run on the same devices), ``max_processes_per_slot`` splits each
bundle's resources evenly, GPUs fractionally.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

__all__ = ["ResourcePool", "Slot"]


@dataclass(frozen=True)
class Slot:
    """One device slot: a bundle of a placement group, and the slot's index on its node."""

    placement_group: PlacementGroup
    bundle_index: int
    local_rank: int


class ResourcePool:
    """Device slots on one or more nodes.

    Args:
        slots_per_node: number of device slots on each node, e.g. ``[8, 8]`` for two 8-GPU nodes.
        use_gpu: whether each slot holds a GPU.
        cpus_per_slot: CPUs reserved per slot (fractions are fine on small CPU machines).
        max_processes_per_slot: how many separate worker processes may share one slot.
        name: a label used in error messages.
        custom_resources: custom Ray resources each slot's bundle reserves (per slot), e.g.
            ``{"rollout_node": 1}``; only nodes that offer them can hold the pool.
        ready_timeout_s: how long to wait for the cluster to grant the placement groups.
    """

    def __init__(
        self,
        slots_per_node: Sequence[int],
        use_gpu: bool = False,
        cpus_per_slot: float = 1.0,
        max_processes_per_slot: int = 1,
        name: str = "pool",
        custom_resources: Mapping[str, float] | None = None,
        ready_timeout_s: float = 60.0,
    ) -> None:
        if not slots_per_node or any(n < 1 for n in slots_per_node):
            raise ValueError(f"pool {name!r}: slots_per_node must be positive counts, got {list(slots_per_node)}")
        if max_processes_per_slot < 1:
            raise ValueError(f"pool {name!r}: max_processes_per_slot must be >= 1")
        self.slots_per_node = tuple(slots_per_node)
        self.use_gpu = use_gpu
        self.cpus_per_slot = cpus_per_slot
        self.max_processes_per_slot = max_processes_per_slot
        self.name = name
        self.custom_resources = dict(custom_resources or {})
        self.ready_timeout_s = ready_timeout_s
        self._placement_groups: list[PlacementGroup] | None = None

    @property
    def world_size(self) -> int:
        return sum(self.slots_per_node)

    @property
    def process_resources(self) -> dict[str, float]:
        """Ray resources one worker process takes from its slot."""
        share = 1.0 / self.max_processes_per_slot
        return {"num_cpus": self.cpus_per_slot * share, "num_gpus": share if self.use_gpu else 0.0}

    def placement_groups(self) -> list[PlacementGroup]:
        """The pool's placement groups, one per node, created on first use."""
        if self._placement_groups is None:
            bundle = {
                "CPU": self.cpus_per_slot,
                **({"GPU": 1.0} if self.use_gpu else {}),
                **self.custom_resources,
            }
            groups = [
                placement_group([dict(bundle) for _ in range(n)], strategy="STRICT_PACK", name=f"{self.name}-node{i}")
                for i, n in enumerate(self.slots_per_node)
            ]
            ready, _ = ray.wait([g.ready() for g in groups], num_returns=len(groups), timeout=self.ready_timeout_s)
            if len(ready) != len(groups):
                for group in groups:
                    remove_placement_group(group)
                raise RuntimeError(
                    f"pool {self.name!r}: the cluster could not place {list(self.slots_per_node)} slots of "
                    f"{bundle} within {self.ready_timeout_s:.0f} s; cluster resources: {ray.cluster_resources()}"
                )
            self._placement_groups = groups
        return self._placement_groups

    def slots(self) -> list[Slot]:
        """Every slot, node by node; the list index is the rank of the process placed there."""
        return [
            Slot(group, index, index)
            for group, n in zip(self.placement_groups(), self.slots_per_node, strict=True)
            for index in range(n)
        ]

    def release(self) -> None:
        """Give the placement groups back to the cluster."""
        for group in self._placement_groups or []:
            remove_placement_group(group)
        self._placement_groups = None

    def __repr__(self) -> str:
        return f"ResourcePool({self.name!r}, slots={list(self.slots_per_node)}, gpu={self.use_gpu})"
