"""`gpuflow gpu-check`: the acceptance run of every CUDA path (a CPU smoke test without a GPU)."""

from __future__ import annotations

import argparse

from gpuflow.registry import lazy


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the gpu-check step to the `gpuflow` parser."""
    check = subparsers.add_parser(
        "gpu-check",
        help="run every CUDA path at paper sizes against references (tiny sizes on CPU)",
    )
    check.add_argument("--out", default="results/gpu_check.json", help="JSON list of rows")
    check.add_argument(
        "--size",
        default="auto",
        choices=["auto", "full", "tiny"],
        help="auto: full (paper sizes) with a GPU, tiny without",
    )
    check.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    check.add_argument(
        "--cpu-workers", type=int, default=2, help="CPU workers standing in for GPUs on CPU"
    )
    check.add_argument(
        "--record-dir",
        default=None,
        help="also write the run's record there (<date>-<device>.json) and print the change "
        "against the latest record of the same device (make gpu-check: benchmarks/records)",
    )
    check.set_defaults(run=lazy("gpuflow.ops.gpu_check.main:main"))
