"""`gpuflow gpu-check`: the acceptance run of every CUDA path (a CPU smoke test without a GPU)."""

from __future__ import annotations

import argparse

from gpuflow.ops.gpu_check.sections import SECTIONS
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
        "--sections",
        nargs="+",
        choices=SECTIONS,
        default=list(SECTIONS),
        help="run only these sections (default: all); a run of some sections writes its record "
        "as <date>-<device>-<sections>.json and compares only the rows it ran",
    )
    check.add_argument(
        "--skip-compile",
        action="store_true",
        help="leave out the perplexity section's torch.compile row (on an H100 about half of "
        "the whole run's time, compiling GPT-2-large; fluency.perplexity.compile is off)",
    )
    check.add_argument(
        "--record-dir",
        default=None,
        help="also write the run's record there (<date>-<device>.json) and print the change "
        "against the latest record of the same device (make gpu-check: benchmarks/records)",
    )
    check.set_defaults(run=lazy("gpuflow.ops.gpu_check.main:main", outputs=("out",)))
