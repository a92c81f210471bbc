"""`gpuflow sweep-shard`: one (method, teacher rank, student width) over a range of seeds."""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
import time
from typing import Any

from tqdm import tqdm

from gpuflow.errors import ConfigError, GpuflowError
from gpuflow.job import current, write_json, write_text
from gpuflow.settings.blocks import family_settings, results_of
from gpuflow.sweep.checks import check_rank
from gpuflow.sweep.columns import COLUMNS
from gpuflow.sweep.experiment import METHODS
from gpuflow.sweep.pool import Outcome, SeedPool
from gpuflow.sweep.work import cell_settings, seed_settings

TARGET = "gpuflow.sweep.experiment:run_seed"
CURVE = ("seed", "reached_threshold", "train_error", "test_error", "steps", "guesses", "wall_s")


def parse_seeds(text: str) -> list[int]:
    """'START:STOP' (STOP excluded) as a list of seeds."""
    try:
        start, stop = (int(part) for part in text.split(":"))
    except ValueError:
        raise ConfigError("--seeds", f"cannot read {text!r}", "START:STOP, e.g. 0:25") from None
    if not 0 <= start < stop:
        raise ConfigError("--seeds", f"empty or negative range {text!r}", "0 <= START < STOP")
    return list(range(start, stop))


def state_key(args: argparse.Namespace, sweep: dict[str, Any], device_type: str) -> dict[str, Any]:
    """What the shard's resume state must match to be resumed: the results keys of the sweep's data
    and method, the shard's cell, and the device type (guesses and student weights are drawn
    on the device: seeds of one device type only)."""
    cell = {"method": args.method, "rank": args.teacher_rank, "width": args.student_width}
    results = results_of("sweep", seed_settings(sweep, args.method))
    return {"settings": results, "identity": {**cell, "device_type": device_type}}


def table_text(rows: list[dict[str, Any]]) -> str:
    """Rows as CSV text with the fixed column order (None as empty)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def cell_summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The shard's seeds in three numbers: the share that reached the threshold, the mean test
    and train error (NaN where no row holds one)."""

    def mean(key: str) -> float:
        values = [float(row[key]) for row in rows if row.get(key) is not None]
        return sum(values) / len(values) if values else math.nan

    return {
        "reached_share": mean("reached_threshold"),
        "mean_test_error": mean("test_error"),
        "mean_train_error": mean("train_error"),
    }


def log(message: str) -> None:
    """A line in the job's log (stderr), printed above the progress bar."""
    tqdm.write(message, file=sys.stderr)


def main(args: argparse.Namespace) -> int:
    """Run the shard's missing seeds, then write its table and run record."""
    from gpuflow.job import run_record, worker_devices

    if args.method not in METHODS:
        raise ConfigError("--method", f"unknown method {args.method!r}", f"one of {METHODS}")
    seeds = parse_seeds(args.seeds)
    sweep = family_settings("sweep", args.settings, args.runtime)
    check_rank(args.teacher_rank, sweep["data"])
    settings = cell_settings(sweep, args.method, args.teacher_rank, args.student_width)
    devices = worker_devices(sweep["device"], sweep["cpu_workers"])
    job = current([args.out, args.run_out])
    key = state_key(args, sweep, devices[0].type)
    state = job.state(**key)
    rows: dict[int, dict[str, Any]] = {}
    failed: dict[int, str] = {}

    def restore(saved: dict[str, Any]) -> int:
        rows.update((s, row) for s, row in saved["rows"].items() if s in seeds)
        return len(rows)

    units = job.units(state, len(seeds), "seeds", restore, lambda: {"rows": rows, "failed": failed})
    tracked = job.track({**key["identity"], **key["settings"], "seeds": args.seeds})
    started = time.perf_counter()
    todo = [s for s in seeds if s not in rows]
    name = f"{args.method} rank={args.teacher_rank} width={args.student_width}"
    log(
        f"{name}: {len(seeds)} seeds, {len(rows)} already done, computing {len(todo)}:"
        f" {todo} on {len(devices)} worker(s) {[str(d) for d in devices]}"
    )
    bar = tqdm(total=len(seeds), initial=len(rows), desc=name, file=sys.stderr, mininterval=1)

    def report(outcome: Outcome) -> None:
        if outcome.row is not None:
            rows[outcome.seed] = outcome.row
            curve = {k: outcome.row.get(k) for k in CURVE}
            tracked.log(len(rows) + len(failed), curve)
        else:
            failed[outcome.seed] = outcome.error or "unknown error"
            log(f"seed {outcome.seed} failed:\n{outcome.error}")
        bar.update(1)
        where = f"after {len(rows)} of {len(seeds)} seeds (in {state.path})"
        units.finished(len(rows) + len(failed), where)

    pool = SeedPool(TARGET, settings, [str(d) for d in devices], log=log)
    pool.run(todo, report)
    bar.close()
    if failed:
        raise GpuflowError(
            f"{len(failed)} of {len(seeds)} seed(s) failed: {sorted(failed)}"
            " (errors above; a re-run retries only them)"
        )
    table = [rows[s] for s in seeds]
    write_text(args.out, table_text(table))
    tracked.table(len(seeds), "seeds", [{k: row.get(k) for k in COLUMNS} for row in table])
    tracked.final(len(seeds), cell_summary(table))
    write_json(
        args.run_out,
        {
            **run_record(devices),
            "seeds": [seeds[0], seeds[-1] + 1],
            "computed": todo,
            "resumed": len(seeds) - len(todo),
            "worker_deaths": pool.deaths,
            "wall_s": time.perf_counter() - started,
        },
    )
    job.release(outputs=[args.out, args.run_out])
    log(f"{name}: wrote {args.out} ({len(seeds)} rows)")
    return 0
