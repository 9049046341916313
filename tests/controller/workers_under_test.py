"""Worker classes the controller tests place on real Ray processes."""

from __future__ import annotations

import os
import threading
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from hybridflow.controller import DataParallel, Worker, register
from hybridflow.protocol import Batch


class MeshWorker(Worker):
    """Four ranks arranged as a (dp=2, tp=2) device mesh named "infer"."""

    def __init__(self) -> None:
        super().__init__()
        mesh = init_device_mesh("cpu", (self.world_size // 2, 2), mesh_dim_names=("dp", "tp"))
        self.register_device_mesh("infer", mesh, dp_dim="dp")
        self.rows_seen: list[int] = []

    @register(dispatch=DataParallel("infer"))
    def tag_rows(self, batch: Batch) -> Batch:
        """Return each row with the rank and dp rank that processed it."""
        self.rows_seen.extend(batch["row_id"].tolist())
        n = len(batch)
        info = self.mesh_info("infer")
        return batch | Batch(
            {"dp_rank": torch.full((n,), info.dp_rank), "rank": torch.full((n,), self.rank)},
            {"owner": [f"rank{self.rank}"] * n},
        )

    @register(dispatch=DataParallel("infer"))
    def sample_rows(self, batch: Batch, n: int) -> Batch:
        """``n`` output rows per input row, in input order (as generation returns ``n`` samples per prompt)."""
        return Batch({"row_id": batch["row_id"].repeat_interleave(n), "sample": torch.arange(n).repeat(len(batch))})

    @register(dispatch="one_to_all")
    def rows_seen_so_far(self) -> list[int]:
        return list(self.rows_seen)

    @register(dispatch=DataParallel("infer"), blocking=False)
    def double(self, batch: Batch) -> Batch:
        return Batch({"x": batch["x"] * 2, "row_id": batch["row_id"]})

    @register(dispatch=DataParallel("infer"), blocking=False)
    def add_rank_parity(self, batch: Batch) -> Batch:
        # Both tp ranks of a dp group compute this; only the collector's output is returned.
        return Batch({"x": batch["x"] + 1, "row_id": batch["row_id"], "by_rank": torch.full((len(batch),), self.rank)})

    @register(dispatch="one_to_all")
    def echo(self, value: object) -> tuple[int, object]:
        return self.rank, value

    @register(dispatch="all_to_all")
    def square_own(self, value: int) -> int:
        return value * value + self.rank

    @register(dispatch="rank_zero")
    def whoami(self) -> int:
        return self.rank

    @register(dispatch="one_to_all", execute="rank_zero")
    def rank_zero_only(self) -> int:
        return self.rank

    @register(dispatch="one_to_all")
    def all_reduce_rank(self) -> float:
        value = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(value)
        return value.item()


class StatefulRole(Worker):
    """A role that keeps a value; several are colocated in one process."""

    def __init__(self, label: str) -> None:
        super().__init__()
        self.label = label
        self.value = 0

    @register(dispatch="one_to_all")
    def set_value(self, value: int) -> None:
        self.value = value + self.rank

    @register(dispatch="one_to_all")
    def describe(self) -> tuple[str, int, int]:
        return self.label, self.value, os.getpid()


class FaultyWorker(Worker):
    @register(dispatch="one_to_all")
    def fail_on(self, bad_rank: int) -> int:
        if self.rank == bad_rank:
            raise ValueError(f"boom from rank {self.rank}")
        return self.rank

    @register(dispatch="one_to_all")
    def exit_on(self, bad_rank: int, notice_delay_s: float = 0.0) -> int:
        """``bad_rank`` exits while the others wait in a collective, which then fails on them. With
        ``notice_delay_s``, it first closes its connections and lives on that long, so the survivors'
        error reaches the controller before Ray notices the death (an order a loaded host gives at
        random)."""
        if self.rank == bad_rank:
            if notice_delay_s:
                dist.destroy_process_group()
                time.sleep(notice_delay_s)
            os._exit(3)
        dist.barrier()
        return self.rank

    @register(dispatch="one_to_all")
    def exit_while_others_sleep(self, bad_rank: int, sleep_s: float) -> int:
        """``bad_rank`` exits while the others are busy for ``sleep_s`` and notice nothing."""
        if self.rank == bad_rank:
            os._exit(3)
        time.sleep(sleep_s)
        return self.rank


class BrokenOnRank(Worker):
    """A role whose constructor raises on one rank, after the other ranks have built it."""

    def __init__(self, bad_rank: int) -> None:
        super().__init__()
        if self.rank == bad_rank:
            raise RuntimeError(f"cannot build on rank {self.rank}")


class ThreadCounts(Worker):
    """Reports torch's thread count in the thread that runs the role and in a helper thread."""

    @register(dispatch="one_to_all")
    def counts(self) -> tuple[int, int, str | None]:
        seen: dict[str, int] = {}
        helper = threading.Thread(target=lambda: seen.update(threads=torch.get_num_threads()))
        helper.start()
        helper.join()
        return torch.get_num_threads(), seen["threads"], os.environ.get("OMP_NUM_THREADS")


class Placeholder:
    """A bare Ray actor class: occupies an actor name so that a later actor of that name fails."""

    def ping(self) -> str:
        return "pong"


class ColumnWorker(Worker):
    """Methods that declare their Batch contract; one breaks its own (returns no ``y``)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    @register(dispatch=DataParallel(), reads=("x",), writes=("y",))
    def double_x(self, batch: Batch) -> Batch:
        self.calls += 1
        return Batch({"y": batch["x"] * 2})

    @register(dispatch=DataParallel(), reads=("x",), writes=("y",))
    def forgets_y(self, batch: Batch) -> Batch:
        return Batch({"z": batch["x"]})

    @register(dispatch="one_to_all")
    def call_count(self) -> int:
        return self.calls


class WrappingColumnWorker(ColumnWorker):
    """Overrides ``double_x`` without ``@register``: it keeps the registration of the method it overrides."""

    def double_x(self, batch: Batch) -> Batch:
        return super().double_x(batch) | Batch({"wrapped_by_rank": torch.full((len(batch),), self.rank)})
