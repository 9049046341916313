"""Sandbox overhead per call, and the calls per second the machine sustains.

Overhead: ``print(1)`` run ``--calls`` times one after another in the sandbox (bwrap, the seccomp
filter, the rlimit launcher, a private directory made and removed, output captured) against the same
program run unsandboxed as ``/usr/bin/python3 -I -c 'print(1)'`` through ``subprocess.run``; median and
p99 of each and the ratio of the medians. Throughput: ``--calls`` sandboxed ``print(1)`` runs submitted
at once to a sandbox with N worker threads, for each N of ``--workers``; calls per second of wall time.

    python benchmarks/bench_sandbox.py [--calls 200] [--workers 1 2 4 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hybridflow.sandbox import Outcome, Sandbox

PROGRAM = "print(1)\n"


def percentile(values: list[float], share: float) -> float:
    """The ``share`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def time_sandboxed(sandbox: Sandbox, calls: int) -> list[float]:
    """Seconds of each of ``calls`` sequential sandboxed runs."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        result = sandbox.run(PROGRAM)
        times.append(time.perf_counter() - start)
        if result.outcome is not Outcome.OK or result.stdout != "1\n":
            raise RuntimeError(f"sandboxed print(1) failed: {result}")
    return times


def time_plain(calls: int) -> list[float]:
    """Seconds of each of ``calls`` sequential unsandboxed runs."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        subprocess.run(["/usr/bin/python3", "-I", "-c", PROGRAM], capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return times


def throughput(workers: int, calls: int) -> float:
    """Sandboxed calls per second with ``workers`` threads running them."""
    sandbox = Sandbox(max_workers=workers)
    try:
        start = time.perf_counter()
        results = [future.result() for future in [sandbox.submit(PROGRAM) for _ in range(calls)]]
        elapsed = time.perf_counter() - start
    finally:
        sandbox.close()
    if any(result.outcome is not Outcome.OK for result in results):
        raise RuntimeError("a sandboxed print(1) failed under load")
    return calls / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args()
    print(f"cpus={os.cpu_count()} load_average={os.getloadavg()[0]:.1f}")
    sandbox = Sandbox()
    time_sandboxed(sandbox, 3)  # warm-up: page cache, the interpreter's files
    sandboxed = time_sandboxed(sandbox, args.calls)
    plain = time_plain(args.calls)
    print("| run | median ms | p99 ms |")
    print("| --- | --- | --- |")
    for name, times in (("sandboxed", sandboxed), ("plain python -c", plain)):
        print(f"| {name} | {1000 * statistics.median(times):.1f} | {1000 * percentile(times, 0.99):.1f} |")
    print(f"median ratio: {statistics.median(sandboxed) / statistics.median(plain):.2f}x")
    print("| workers | calls/s |")
    print("| --- | --- |")
    for workers in args.workers:
        print(f"| {workers} | {throughput(workers, args.calls):.1f} |")


if __name__ == "__main__":
    main()
