"""gpuflow.job: the lifecycle every step runs inside (see `context`), and the one API the
families use: they import from here, never from a submodule.

`Job` and `current` give the step's job (its `state`, resumable `loop` and `units`, `release`,
guards). The other names (atomic writes, devices and workers, resume states, the fp16 guard's
`SkippedSteps`, `telemetry_section` for a family's report) are imported on first use from the
module `_WHERE` names: `gpuflow status` and `plan` import this package without torch.

Modules: `context` (the Job), `loop` (resumable loops over units), `chunks` (scores saved per
chunk), `paths` (where job files live), `state` (the one resume format), `progress`, `record`
(the job record), `finished_states` (states kept until the run accepts the outputs),
`divergence` (NaN guard).
"""

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
