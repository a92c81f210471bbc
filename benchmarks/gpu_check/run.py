"""Run every check, write the rows as JSON and print them as a table."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from benchmarks.gpu_check.lock_check import lock_row
from benchmarks.gpu_check.peak import measured_peaks
from benchmarks.gpu_check.perplexity_check import oom_row, precision_rows, save_random_lm
from benchmarks.gpu_check.records import save_and_compare
from benchmarks.gpu_check.rows import CheckRow, failed_row
from benchmarks.gpu_check.scaling_check import scaling_rows
from benchmarks.gpu_check.sections import SECTIONS
from benchmarks.gpu_check.sizes import CheckSizes, full_sizes, tiny_sizes
from benchmarks.gpu_check.ssvae_check import ssvae_rows
from benchmarks.gpu_check.sweep_check import sweep_row
from benchmarks.gpu_check.telemetry_check import telemetry_row
from gpuflow.job.atomic import write_json
from gpuflow.job.devices import describe_device, worker_devices


def checked(name: str, section: Callable[[], list[CheckRow]]) -> list[CheckRow]:
    """The rows of one section; a section that raises becomes one failed row naming the error."""
    start = time.perf_counter()
    print(f"gpu-check: {name} ...", file=sys.stderr, flush=True)
    try:
        rows = section()
    except Exception as error:  # a failed path is a result of the check, not its end
        rows = [failed_row(name, error, time.perf_counter() - start)]
    print(f"gpu-check: {name} took {time.perf_counter() - start:.1f} s", file=sys.stderr)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows


def run_checks(
    sizes: CheckSizes,
    devices: list[torch.device],
    peaks: dict[str, float],
    folder: Path,
    sections: Sequence[str] = SECTIONS,
    compile: bool = True,
) -> list[CheckRow]:
    """The `sections` in SECTIONS order, the biggest GPU user (the LM) first; the perplexity
    section's torch.compile row only with `compile`."""
    on_gpu = devices[0].type == "cuda"
    lm_folder = folder / "lm"
    if {"perplexity", "oom"} & set(sections):
        n_params = save_random_lm(lm_folder, sizes.lm, devices[0])
    worlds = list(range(1, len(devices) + 1)) if on_gpu else [1, 2]
    pool = [str(i) for i in range(len(devices))]
    runs: dict[str, tuple[str, Callable[[], list[CheckRow]]]] = {
        "perplexity": (
            "perplexity precisions",
            lambda: precision_rows(lm_folder, n_params, sizes, devices, peaks, compile),
        ),
        "oom": (
            "perplexity out-of-memory split",
            lambda: [oom_row(lm_folder, n_params, sizes, devices, peaks)],
        ),
        "ssvae": ("ssvae", lambda: ssvae_rows(sizes.ssvae, devices[0], peaks["float32"])),
        "scaling": ("scaling", lambda: scaling_rows(folder, sizes.scaling, worlds, peaks)),
        "sweep": ("sweep", lambda: [sweep_row(sizes.sweep, devices)]),
        "locks": ("gpu locks", lambda: [lock_row(folder, pool, on_gpu)]),
        "telemetry": ("telemetry", lambda: [telemetry_row(devices)]),
    }
    rows: list[CheckRow] = []
    for section in SECTIONS:
        if section in sections:
            rows += checked(*runs[section])
    return rows


def format_table(rows: list[CheckRow]) -> str:
    """The rows as a fixed-width text table."""
    lines = [
        f"{'path':70s} {'ok':4s} {'throughput':>20s} {'TFLOP/s':>8s} {'% peak':>7s}  deviation"
    ]
    for row in rows:
        rate = f"{row.throughput:,.0f} {row.unit}" if row.throughput is not None else "-"
        tflops = f"{row.tflops:.3g}" if row.tflops is not None else "-"
        share = f"{100 * row.share_of_peak:.1f}" if row.share_of_peak is not None else "-"
        lines.append(
            f"{row.path[:70]:70s} {'yes' if row.ok else 'NO':4s} {rate:>20s} {tflops:>8s} "
            f"{share:>7s}  {row.deviation}"
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """gpu-check: exit 0 when every row is ok, 1 otherwise."""
    devices = worker_devices(args.device, args.cpu_workers)
    on_gpu = devices[0].type == "cuda"
    sizes = (
        full_sizes() if args.size == "full" or (args.size == "auto" and on_gpu) else tiny_sizes()
    )
    peaks = measured_peaks(devices[0], sizes.peak_matmul)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        rows = run_checks(sizes, devices, peaks, Path(tmp), args.sections, not args.skip_compile)
    table = [{**row.as_dict(), "sizes": sizes.name, "peak_tflops_by_dtype": peaks} for row in rows]
    write_json(args.out, table)
    names = sorted({describe_device(d) for d in devices})
    print(
        f"gpu-check ({sizes.name} sizes) on {', '.join(names)}; matmul peaks (TFLOP/s): "
        + ", ".join(f"{k} {v:.1f}" for k, v in peaks.items())
    )
    print(format_table(rows))
    if args.record_dir:
        record, change = save_and_compare(
            Path(args.record_dir), table, devices, Path.cwd(), sections=args.sections
        )
        print(f"gpu-check: record written to {record}")
        print("\n".join(change))
    failed = [row.path for row in rows if not row.ok]
    if failed:
        print(f"gpu-check: {len(failed)} of {len(rows)} rows failed: {failed}", file=sys.stderr)
        return 1
    print(f"gpu-check: all {len(rows)} rows ok; wrote {args.out}")
    return 0
