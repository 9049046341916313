"""This machine's achievable peak, measured once, and stored for the runs' per-phase efficiency metrics.

Times a large square matmul in float32 and bfloat16 (FLOP/s) and a streaming copy (bytes read plus
written per second), the best of ``--repeats`` runs each after a warm-up
(`hybridflow.metrics.efficiency.measure_machine_peak`), and stores them under this device's name in
``--file`` (the default is `trainer.machine_peak_file`'s). Every later run on this device then logs
``perf/mfu_update``, ``perf/mfu_log_prob``, ``perf/mfu_ref`` and ``perf/generation_bandwidth_frac``
(docs/metrics.md, "Against the machine's limit"). Run it on a quiet machine: the figure is the ceiling
the phases are held against.

Run (from the repository root):
    python benchmarks/bench_machine_peak.py [--device cpu|cuda] [--matmul-size 2048] [--copy-mib 512]
        [--repeats 5] [--budget-s 20] [--file ~/.cache/hybridflow/machine_peak.json] [--no-save]
"""

from __future__ import annotations

import argparse

import torch

from hybridflow.metrics.efficiency import DEFAULT_PEAK_FILE, measure_machine_peak, save_machine_peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--matmul-size", type=int, default=2048)
    parser.add_argument("--copy-mib", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=20.0, help="seconds of timed runs per measurement")
    parser.add_argument("--file", default=DEFAULT_PEAK_FILE)
    parser.add_argument("--no-save", action="store_true", help="print the figures without storing them")
    args = parser.parse_args()
    peak = measure_machine_peak(args.device, args.matmul_size, args.copy_mib, args.repeats, budget_s=args.budget_s)
    print(f"device: {peak.device} (torch {torch.__version__}, {torch.get_num_threads()} threads)")
    for dtype, flops in peak.matmul_flops.items():
        print(f"matmul {args.matmul_size}x{args.matmul_size} {dtype:>9}: {flops / 1e9:10.1f} GFLOP/s")
    print(f"copy {args.copy_mib} MiB (read + write): {peak.copy_bytes_per_s / 1e9:10.2f} GB/s")
    if not args.no_save:
        print(f"stored in {save_machine_peak(peak, args.file)}")


if __name__ == "__main__":
    main()
