"""A memory plan: per process kind, the bytes of each component at the peak of each phase of a step.

The numbers come from `hybridflow.planning.memory_terms`; this module holds them, picks the peak and
prints the table::

    plan = MemoryPlan("cpu", (ProcessPlan("actor_rollout", 2, (phase_a, phase_b)),), notes=())
    print(render_plan(plan, device_bytes=parse_bytes("80GiB")))
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "MemoryPlan",
    "PhaseMemory",
    "ProcessPlan",
    "format_bytes",
    "parse_bytes",
    "peak_moment",
    "render_plan",
]

_UNITS = {
    "": 1,
    "B": 1,
    "K": 1000,
    "KB": 1000,
    "M": 1000**2,
    "MB": 1000**2,
    "G": 1000**3,
    "GB": 1000**3,
    "T": 1000**4,
    "TB": 1000**4,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


@dataclass(frozen=True)
class PhaseMemory:
    """Memory of one rank at one moment of a phase.

    Attributes:
        phase: the step's phase (``generate``, ``update_actor``, ...).
        moment: when within the phase (e.g. ``weight push``, ``head backward``).
        components: bytes per component (``actor params``, ``KV cache``, ...); zero entries may be left out.
    """

    phase: str
    moment: str
    components: Mapping[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Sum of the components, in bytes."""
        return sum(self.components.values())


def peak_moment(moments: Iterable[PhaseMemory]) -> PhaseMemory:
    """The moment with the largest total (the first one on a tie)."""
    best: PhaseMemory | None = None
    for moment in moments:
        if best is None or moment.total > best.total:
            best = moment
    if best is None:
        raise ValueError("a phase needs at least one moment")
    return best


@dataclass(frozen=True)
class ProcessPlan:
    """One kind of worker process (every rank of a resource pool holds the same roles).

    Attributes:
        roles: the roles colocated in the process, e.g. ``actor_rollout+critic``.
        ranks: processes of this kind (the pool's world size).
        phases: each phase of a step at its peak moment, in step order.
    """

    roles: str
    ranks: int
    phases: tuple[PhaseMemory, ...]

    def peak(self) -> PhaseMemory:
        """The phase whose peak is highest."""
        return peak_moment(self.phases)


@dataclass(frozen=True)
class MemoryPlan:
    """Per-rank memory of a run, before it launches.

    Attributes:
        device: ``cuda`` (device memory) or ``cpu`` (host memory of one process).
        processes: one plan per kind of worker process.
        notes: what the estimate assumes and leaves out, one line each.
    """

    device: str
    processes: tuple[ProcessPlan, ...]
    notes: tuple[str, ...] = ()


def parse_bytes(text: str) -> int:
    """``"80GiB"``, ``"80 GB"``, ``"512MiB"``, ``"1.5e9"`` -> bytes (``GiB`` = 2^30, ``GB`` = 10^9).

    Raises:
        ValueError: not a size.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"not a memory size: {text!r} (examples: 80GiB, 24GB, 512MiB)")
    return int(float(match.group(1)) * _UNITS[unit])


def format_bytes(nbytes: int) -> str:
    """Bytes in MiB below 1 GiB, else GiB: ``"512.0 MiB"``, ``"1.25 GiB"``."""
    if abs(nbytes) < 2**30:
        return f"{nbytes / 2**20:.1f} MiB"
    return f"{nbytes / 2**30:.2f} GiB"


def _component_order(process: ProcessPlan) -> list[str]:
    order: list[str] = []
    for phase in process.phases:
        order.extend(name for name in phase.components if name not in order)
    return order


def _table(process: ProcessPlan) -> list[str]:
    peak = process.peak()
    headers = ["component"] + [f"{p.phase}{' *' if p is peak else ''}" for p in process.phases]
    rows = [["(moment)"] + [p.moment for p in process.phases]]
    for name in _component_order(process):
        cells = [p.components.get(name, 0) for p in process.phases]
        if any(cells):
            rows.append([name] + [format_bytes(c) if c else "-" for c in cells])
    rows.append(["total"] + [format_bytes(p.total) for p in process.phases])
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return [line(headers), rule, line(rows[0]), *(line(r) for r in rows[1:-1]), rule, line(rows[-1])]


def render_plan(plan: MemoryPlan, device_bytes: int | None = None) -> str:
    """The plan as text: per process kind a phase x component table (peak column marked ``*``), the
    peak phase, and with ``device_bytes`` whether each process fits."""
    memory = "device memory" if plan.device == "cuda" else "host memory of the process"
    out: list[str] = []
    for process in plan.processes:
        peak = process.peak()
        out.append(f"{process.roles}: {process.ranks} rank(s); per rank, {memory} ({plan.device})")
        out.extend(_table(process))
        out.append(f"peak: {peak.phase} ({peak.moment}), {format_bytes(peak.total)} per rank")
        if device_bytes is not None:
            spare = device_bytes - peak.total
            verdict = (
                f"fits in {format_bytes(device_bytes)} ({format_bytes(spare)} to spare)"
                if spare >= 0
                else f"does NOT fit in {format_bytes(device_bytes)} (short by {format_bytes(-spare)})"
            )
            out.append(verdict)
        out.append("")
    out.extend(f"note: {note}" for note in plan.notes)
    return "\n".join(out).rstrip() + "\n"
