"""Dispatch modes: how a worker-group call's arguments reach the ranks, and how outputs come back.

A `DispatchMode` has two halves:

- ``dispatch(layout, args, kwargs)`` returns the arguments of each rank that executes the call, and a
  *plan* (whatever ``collect`` needs to know, e.g. how many padding rows were added);
- ``collect(layout, outputs, plan)`` turns the per-rank outputs into the call's result.

Built-in modes, by registered name:

========================  ==================================================================
``one_to_all``            every rank gets the same arguments; result: list of per-rank outputs
``all_to_all``            every argument is a list with one entry per rank; result: list
``rank_zero``             only rank 0 executes; result: its output
``dp_compute``            `DataParallel` over the mesh ``"world"`` (dp over all ranks)
========================  ==================================================================

`DataParallel(mesh)` splits every `Batch` argument across the dp groups of a *named mesh*: each dp
group gets one contiguous shard (the batch is first padded to a multiple of the dp size by repeating
its first rows), every rank of a dp group gets the same shard, and only the group's collecting rank
returns output. The result is the shards' outputs concatenated in dp order with the padding dropped,
so each input row comes back exactly once and in order.

A recipe adds a mode with `register_dispatch_mode`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from hybridflow.controller.worker import WORLD_MESH, MeshInfo
from hybridflow.protocol import Batch

__all__ = [
    "DISPATCH_MODES",
    "DataParallel",
    "DispatchMode",
    "GroupLayout",
    "RankCall",
    "ShardRefs",
    "get_dispatch_mode",
    "register_dispatch_mode",
]


class GroupLayout(Protocol):
    """What a dispatch mode may ask of the group it dispatches over."""

    @property
    def world_size(self) -> int: ...

    def mesh(self, name: str) -> list[MeshInfo]:
        """The `MeshInfo` of every rank (index = rank) for the named mesh."""
        ...


@dataclass(frozen=True)
class RankCall:
    """The arguments one rank receives."""

    rank: int
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class DispatchMode:
    """Base class of dispatch modes; subclasses override `dispatch` and `collect`."""

    name: str = ""

    def dispatch(
        self, layout: GroupLayout, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[list[RankCall], Any]:
        raise NotImplementedError

    def collect(self, layout: GroupLayout, outputs: list[Any], plan: Any) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class OneToAll(DispatchMode):
    name = "one_to_all"

    def dispatch(self, layout, args, kwargs):
        return [RankCall(rank, args, kwargs) for rank in range(layout.world_size)], None

    def collect(self, layout, outputs, plan):
        return outputs


class RankZero(DispatchMode):
    name = "rank_zero"

    def dispatch(self, layout, args, kwargs):
        return [RankCall(0, args, kwargs)], None

    def collect(self, layout, outputs, plan):
        return outputs[0]


class AllToAll(DispatchMode):
    name = "all_to_all"

    def dispatch(self, layout, args, kwargs):
        world = layout.world_size
        for where, value in [*((f"argument {i}", a) for i, a in enumerate(args)), *kwargs.items()]:
            if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != world:
                raise ValueError(
                    f"all_to_all: {where} must be a list with one entry per rank ({world}), got {type(value).__name__}"
                )
        calls = [
            RankCall(rank, tuple(a[rank] for a in args), {k: v[rank] for k, v in kwargs.items()})
            for rank in range(world)
        ]
        return calls, None

    def collect(self, layout, outputs, plan):
        return outputs


@dataclass(frozen=True)
class ShardRefs:
    """The output of an earlier data-parallel call, left on the workers: one backend reference per
    dp group (in dp order) and the number of padding rows those shards carry."""

    shards: list[Any]
    pad: int


@dataclass(frozen=True)
class DataParallelPlan:
    """What `DataParallel.collect` needs: the mesh, the padding added, the collecting ranks, and the rows
    of each input shard (``None`` when the input came as chained shards)."""

    mesh: str
    pad: int
    collectors: tuple[int, ...]  # rank collecting for dp group i, in dp order
    shard_rows: int | None = None


class DataParallel(DispatchMode):
    """Split `Batch` arguments by the dp rank of the named mesh; other arguments go to every rank.

    Args:
        mesh: the named mesh whose dp rank decides each rank's shard.
        allow_padding: pad a batch whose length the dp size does not divide by repeating its first
            rows (their outputs are dropped on collection). Training methods set this to False:
            repeated rows would be trained on twice, so an uneven batch is an error there.
    """

    def __init__(self, mesh: str = WORLD_MESH, allow_padding: bool = True) -> None:
        self.mesh = mesh
        self.allow_padding = allow_padding
        self.name = f"dp_compute[{mesh}]" if mesh != WORLD_MESH else "dp_compute"

    def plan(self, layout: GroupLayout, pad: int, shard_rows: int | None = None) -> DataParallelPlan:
        infos = layout.mesh(self.mesh)
        dp_size = infos[0].dp_size
        collectors: list[int | None] = [None] * dp_size
        for rank, info in enumerate(infos):
            if info.dp_size != dp_size:
                raise ValueError(f"mesh {self.mesh!r}: ranks disagree on dp size")
            if info.is_collector:
                if collectors[info.dp_rank] is not None:
                    raise ValueError(f"mesh {self.mesh!r}: dp group {info.dp_rank} has two collecting ranks")
                collectors[info.dp_rank] = rank
        missing = [dp for dp, rank in enumerate(collectors) if rank is None]
        if missing:
            raise ValueError(f"mesh {self.mesh!r}: dp groups {missing} have no collecting rank")
        return DataParallelPlan(self.mesh, pad, tuple(collectors), shard_rows)  # type: ignore[arg-type]

    def dispatch(self, layout, args, kwargs):
        infos = layout.mesh(self.mesh)
        dp_size = infos[0].dp_size
        lengths = {len(v) for v in [*args, *kwargs.values()] if isinstance(v, Batch)}
        if len(lengths) > 1:
            raise ValueError(f"{self.name}: Batch arguments have different lengths {sorted(lengths)}")
        pads: set[int] = set()

        def shard(value: Any) -> Any:
            if isinstance(value, ShardRefs):
                if len(value.shards) != dp_size:
                    raise ValueError(f"{self.name}: a chained output has {len(value.shards)} shards, mesh has {dp_size}")
                pads.add(value.pad)
                return value.shards
            if not isinstance(value, Batch):
                return [value] * dp_size
            if not self.allow_padding and len(value) % dp_size:
                raise ValueError(
                    f"{self.name}: a batch of {len(value)} rows does not split evenly over {dp_size} "
                    "data-parallel ranks, and this method does not accept padding rows"
                )
            padded, pad = value.pad_to_multiple(dp_size)
            pads.add(pad)
            return padded.split(dp_size)

        sharded_args = [shard(a) for a in args]
        sharded_kwargs = {k: shard(v) for k, v in kwargs.items()}
        calls = [
            RankCall(
                rank,
                tuple(a[info.dp_rank] for a in sharded_args),
                {k: v[info.dp_rank] for k, v in sharded_kwargs.items()},
            )
            for rank, info in enumerate(infos)
        ]
        if len(pads) > 1:
            raise ValueError(f"{self.name}: arguments carry different padding {sorted(pads)}; lengths differ")
        pad = pads.pop() if pads else 0
        shard_rows = (lengths.pop() + pad) // dp_size if lengths else None
        return calls, self.plan(layout, pad, shard_rows)

    def collect(self, layout, outputs, plan: DataParallelPlan):
        shards = [outputs[rank] for rank in plan.collectors]
        return concat_outputs(shards, plan.pad, plan.shard_rows)


def _padding_outputs(shards: list[Any], pad: int, shard_rows: int | None) -> int:
    """Output rows that answer the ``pad`` padding rows: ``pad`` times the rows each input row produced
    (a generation call returns ``n`` samples per prompt). They are the last rows of the last shard."""
    if not pad or shard_rows is None:
        return pad
    produced = len(shards[-1])
    if produced % shard_rows:
        raise ValueError(
            f"a data-parallel shard of {shard_rows} rows (with {pad} padding rows) returned {produced} rows, "
            "not a whole number per input row: the padding rows' outputs cannot be told apart"
        )
    return pad * (produced // shard_rows)


def concat_outputs(shards: list[Any], pad: int, shard_rows: int | None = None) -> Any:
    """Join per-dp-group outputs in dp order and drop the outputs of the ``pad`` trailing input rows.

    Batches and tensors are concatenated along rows; a method that returns ``k`` rows per input row
    (``k`` from the last shard: its ``shard_rows`` input rows) loses ``k * pad``. Anything else (e.g.
    metric dicts) comes back as the list of per-group values, since there are no rows to unpad.
    """
    if all(isinstance(s, Batch) for s in shards):
        return Batch.concat(shards).unpad(_padding_outputs(shards, pad, shard_rows))
    if all(isinstance(s, torch.Tensor) for s in shards):
        joined = torch.cat(shards)
        return joined[: len(joined) - _padding_outputs(shards, pad, shard_rows)]
    return shards


DISPATCH_MODES: dict[str, DispatchMode] = {}


def register_dispatch_mode(mode: DispatchMode, name: str | None = None) -> DispatchMode:
    """Register ``mode`` under ``name`` (default: ``mode.name``) so ``@register(dispatch=name)`` finds it."""
    key = name or mode.name
    if not key:
        raise ValueError("a dispatch mode needs a name")
    if key in DISPATCH_MODES and DISPATCH_MODES[key] is not mode:
        raise ValueError(f"dispatch mode {key!r} is already registered as {DISPATCH_MODES[key]!r}")
    DISPATCH_MODES[key] = mode
    return mode


def get_dispatch_mode(mode: str | DispatchMode) -> DispatchMode:
    """The mode itself, or the registered mode of that name."""
    if isinstance(mode, DispatchMode):
        return mode
    try:
        return DISPATCH_MODES[mode]
    except KeyError:
        raise KeyError(f"unknown dispatch mode {mode!r}; registered modes: {sorted(DISPATCH_MODES)}") from None


for _mode in (OneToAll(), AllToAll(), RankZero(), DataParallel()):
    register_dispatch_mode(_mode)

