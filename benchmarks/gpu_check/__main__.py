"""`python -m benchmarks.gpu_check` (from the repository root; `make gpu-check`): the acceptance
run of every CUDA path (a CPU smoke test without a GPU).

It runs as a gpuflow step does (gpuflow.cli.run_step): inside one job for its `--out`, which
holds the output's lock, writes the job record, stops cleanly on SIGTERM and SIGUSR1 and holds
stop requests while torch is imported; torch is imported only then (benchmarks.gpu_check.run).
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.gpu_check.sections import SECTIONS
from gpuflow.cli import run_step
from gpuflow.registry import add_job_settings_arguments, lazy

STEP = "gpu-check"


def build_parser() -> argparse.ArgumentParser:
    """The gpu-check options (and the job's own `--settings`/`--runtime`, as every step's)."""
    check = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check",
        description="run every CUDA path at paper sizes against references (tiny sizes on CPU)",
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
    add_job_settings_arguments(check)
    check.set_defaults(step=STEP, run=lazy("benchmarks.gpu_check.run:main", outputs=("out",)))
    return check


def main(argv: list[str] | None = None) -> int:
    """Run the check in its job: exit 0 when every row is ok, 1 when one is not, 2 on an error
    or a stop request (one line on stderr), 130 on Ctrl-C."""
    return run_step(build_parser().parse_args(argv), STEP)


if __name__ == "__main__":
    sys.exit(main())
