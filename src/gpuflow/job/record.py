"""The job record: one file per job with what it used, written when its step ends."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpuflow.errors import GpuflowError
from gpuflow.job.atomic import write_json
from gpuflow.job.paths import PROGRESS, RECORD, STATE, job_file
from gpuflow.job.record_attempts import attempt_entry, earlier_attempts, measured_gpus, visible_gpus
from gpuflow.job.stopping import Stopped
from gpuflow.job.telemetry.job import STARTED, JobTelemetry, job_gpus, node_count, tree_root
from gpuflow.job.telemetry.sampler import Sampler


def record_path(first_output: str | Path) -> Path:
    """The record file of the job whose first output is `first_output`."""
    return job_file(first_output, RECORD)


def read_record(path: str | Path) -> dict[str, Any] | None:
    """One record file, or None when it is unreadable (a job of an older gpuflow)."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def record_of(outputs: Iterable[str | Path]) -> dict[str, Any]:
    """The record of the job that writes `outputs` (a rule's outputs); {} where it has none."""
    for output in outputs:
        record = read_record(record_path(output))
        if record is not None:
            return record
    return {}


def ended(record: dict[str, Any]) -> bool:
    """Whether the record is of a step that ended (finished, failed or stopped), so it holds
    the step's telemetry; a record written at the start says "running"."""
    return record.get("status") != STARTED


@contextmanager
def job_record(step: str, outputs: list[Path], interval_s: float) -> Iterator[JobTelemetry | None]:
    """Sample this job every `interval_s` seconds while the block runs; write its record at the
    start and at the end. The top-level fields are this attempt's; `attempts` lists the ones
    before it that it continues (gpuflow.job.record_attempts) and then this one."""
    if not outputs or os.environ.get("RANK", "0") != "0":
        yield None
        return
    visible = job_gpus()
    telemetry = JobTelemetry(Sampler(tree_root(), interval_s, visible, node_count()).start())
    JobTelemetry.active = telemetry
    identity = {
        "step": step,
        "outputs": [str(o) for o in outputs],
        "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "started": time.time(),
    }
    kept = any(job_file(outputs[0], kind).exists() for kind in (STATE, PROGRESS))
    earlier = earlier_attempts(read_record(record_path(outputs[0])), kept)
    attempt = attempt_entry(identity, visible_gpus(visible), earlier)
    try:
        first = {**identity, "status": STARTED, "attempts": [*earlier, attempt]}
        _write(outputs[0], first, quiet=True)
        yield telemetry
        if telemetry.status == STARTED:
            telemetry.status = "finished"
    except (Stopped, KeyboardInterrupt):  # SIGTERM/SIGUSR1, or Ctrl-C on a local run
        telemetry.status = "stopped"
        raise
    except BaseException as error:
        telemetry.status = f"failed ({type(error).__name__})"
        identity["error"] = (str(error).strip().splitlines() or [""])[0][:500]
        raise
    finally:
        JobTelemetry.active = None
        telemetry.sampler.stop()
        summary = telemetry.summary()
        ended_at = time.time()
        gpus = measured_gpus(summary["gpu"]) or attempt["gpus"]
        attempt = {**attempt, "ended": ended_at, "status": telemetry.status, "gpus": gpus}
        record = {**identity, "ended": ended_at, **summary, "attempts": [*earlier, attempt]}
        _write(outputs[0], record, quiet=telemetry.status != "finished")


def _write(first_output: Path, record: dict[str, Any], quiet: bool) -> None:
    """Write the record. When the step starts, and after a step that did not finish, it is
    written only when the output's folder exists (none is made for a job that wrote nothing),
    and a failed write stays silent: the step's own error is the one line to read."""
    if quiet and not Path(first_output).parent.is_dir():
        return
    try:
        write_json(record_path(first_output), record)
    except (OSError, GpuflowError):
        if not quiet:
            raise
