"""gpuflow.job: the lifecycle every step runs inside, and the one API families use."""

from importlib import import_module
from typing import Any

from gpuflow.job.context import Job, current

_WHERE = {
    "ChunkedScores": "chunks",
    "write_csv": "atomic",
    "write_json": "atomic",
    "write_text": "atomic",
    "save_figure": "atomic",
    "save_torch": "atomic",
    "atomic_path": "atomic",
    "worker_devices": "devices",
    "describe_device": "devices",
    "run_record": "devices",
    "threads_per_worker": "cores",
    "WorkerPool": "workers",
    "Done": "workers",
    "State": "state",
    "make_fingerprint": "state",
    "load_optimizer_state": "state",
    "SkippedSteps": "divergence",
    "telemetry_section": "record_tables",
    "markdown_table": "markdown",
}

__all__ = ["Job", "current", *_WHERE]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'gpuflow.job' has no attribute {name!r}")
    module = import_module(f"gpuflow.job.{_WHERE[name]}")
    return getattr(module, "section" if name == "telemetry_section" else name)
