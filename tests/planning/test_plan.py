"""The plan's peak, its fit verdict, its table and memory-size parsing."""

from __future__ import annotations

import pytest

from hybridflow.planning import MemoryPlan, PhaseMemory, ProcessPlan, format_bytes, parse_bytes, render_plan

MIB = 2**20


def _process() -> ProcessPlan:
    return ProcessPlan(
        "actor_rollout",
        2,
        (
            PhaseMemory("generation", "sampling", {"actor params": 100 * MIB, "KV cache": 300 * MIB}),
            PhaseMemory("log_prob", "forward", {"actor params": 100 * MIB, "activations": 250 * MIB}),
            PhaseMemory("update", "head backward", {"actor params": 100 * MIB, "logits": 350 * MIB}),
        ),
    )


def test_peak_is_the_phase_with_the_largest_total() -> None:
    peak = _process().peak()
    assert (peak.phase, peak.total) == ("update", 450 * MIB)
    # On a tie the earlier phase is the peak.
    tied = ProcessPlan("a", 1, (PhaseMemory("x", "m", {"c": 5}), PhaseMemory("y", "m", {"c": 5})))
    assert tied.peak().phase == "x"


def test_table_marks_the_peak_and_says_whether_it_fits() -> None:
    plan = MemoryPlan("cuda", (_process(),), notes=("a note",))
    text = render_plan(plan, device_bytes=400 * MIB)
    header = text.splitlines()[1]
    assert header.split() == ["component", "generation", "log_prob", "update", "*"]
    assert "peak: update (head backward), 450.0 MiB per rank" in text
    assert "does NOT fit in 400.0 MiB (short by 50.0 MiB)" in text
    assert "fits in 1.00 GiB (574.0 MiB to spare)" in render_plan(plan, device_bytes=2**30)
    # A component absent from a phase shows as "-"; totals close the table.
    kv_row = next(line for line in text.splitlines() if line.startswith("KV cache"))
    assert kv_row.split()[2:] == ["300.0", "MiB", "-", "-"]
    assert text.rstrip().endswith("note: a note")


def test_memory_sizes() -> None:
    assert parse_bytes("80GiB") == 80 * 2**30
    assert parse_bytes("80 GB") == 80 * 10**9
    assert parse_bytes("1.5e9") == 1_500_000_000
    assert parse_bytes("512mib") == 512 * MIB
    assert format_bytes(3 * 2**30 // 2) == "1.50 GiB"
    with pytest.raises(ValueError, match="not a memory size: '80 gigs'"):
        parse_bytes("80 gigs")
