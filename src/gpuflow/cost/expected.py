"""Every planned job's expected time, from the best source there is:"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Protocol

from gpuflow.cost.models import counted_work, has_work_model
from gpuflow.cost.predict import Missing, Prediction, from_benchmarks, predict
from gpuflow.cost.rates import RateBook, books, job_row
from gpuflow.cost.records import read_records
from gpuflow.errors import GpuflowError
from gpuflow.work import STARTUP, NotHere, Work

# Not a label fraction: an SSVAE epoch walks the unlabelled digits, so its time hardly moves
# with the labelled share (5,000 labels of 50,000: 450 steps an epoch against 499 at 100).
SIZE_WILDCARDS = ("n", "size", "samples", "steps", "epochs", "tokens", "texts")


class DagJob(Protocol):
    """A planned job, as its expected time needs it (gpuflow.ops.snakemake_adapter.DagJob)."""

    rule: str
    wildcards: dict[str, str]
    resources: dict[str, Any]
    params: str  # the digest of its params


def gpus_of(job: DagJob) -> int:
    """GPUs of the whole job: `gpu`, or nodes x the GPUs per node of `gres` (multi-node rules)."""
    gres = str(job.resources.get("gres", ""))
    per_node = re.search(r"\bgpu(?::[^:,]+)?:(\d+)", gres)
    if per_node:
        return int(float(job.resources.get("nodes", 1) or 1)) * int(per_node[1])
    return int(float(job.resources.get("gpu", 0) or 0))


def runtime_s(job: DagJob) -> float:
    """The job's time limit (first attempt) in seconds."""
    return float(job.resources.get("runtime", 0) or 0) * 60


def size_of(wildcards: dict[str, str]) -> float:
    """Product of the size-like numeric wildcards (1 when there are none)."""
    size = 1.0
    for name, value in wildcards.items():
        if name.lower() in SIZE_WILDCARDS:
            try:
                size *= float(value)
            except ValueError:
                continue
    return size


def alike(done: Work | None, planned: Work | None) -> bool:
    """Whether two works are of the same kinds at the same shapes, start-ups aside."""

    def shapes(work: Work) -> set[tuple[str, str]]:
        return {(t.kind, t.shape) for t in work.terms if t.kind != STARTUP}

    return done is not None and planned is not None and shapes(done) == shapes(planned)


def from_jobs(
    rule: str,
    wildcards: dict[str, str],
    params: str | None,
    work: Work | None,
    jobs: list[dict[str, Any]],
    book: RateBook,
    letter: str,
    name: str,
) -> Prediction | None:
    """A job's time from earlier `jobs` of its rule, scaled by its work; None where none fits."""
    modelled = has_work_model(rule)
    found = []
    for job in jobs:
        if job["rule"] != rule:
            continue
        same = params is not None and job["params"] == params
        if modelled and work is not None and (same or alike(job["work"], work)):
            found.append((job["seconds"], job["work"]))
        elif not modelled and same:
            found.append((job["seconds"] * size_of(wildcards) / size_of(job["wildcards"]), None))
    if not found:
        return None
    if work is not None:
        return from_benchmarks(found, work, book, letter, name)
    scaled = [seconds for seconds, _ in found]
    return Prediction(sum(scaled) / len(scaled), min(scaled), max(scaled), letter, (name,))


def missing_reason(missing: Missing, book: RateBook) -> str:
    """Why a work model gave no time, and the measurement that would give one."""
    kinds = ", ".join(dict.fromkeys(kind.split(" at ")[0] for kind in missing.kinds))
    if (book.device or "").startswith("cpu"):
        return f"no {kinds} rate here: run `gpuflow calibrate` with this config"
    where = f"a {book.device} node" if book.device else "a GPU node"
    reason = f"no {kinds} rate on {book.device or 'a GPU'}: run `gpuflow calibrate` on {where}"
    if any(kind.startswith("allreduce.") for kind in missing.kinds):
        reason += " of as many GPUs, or give the site file's interconnect bandwidths"
    return reason


def recorded_jobs(timings: str | Path | None) -> list[tuple[str, tuple[str, ...], list[Any]]]:
    """(record name, its devices, its job rows) of every record with job rows, newest first."""
    found = []
    for record in read_records(timings) if timings else []:
        jobs = [job for job in map(job_row, record.rows) if job is not None]
        if jobs:
            found.append((record.name, record.devices, jobs))
    return found


class Expected:
    """Expected times of a DAG's jobs (docs/plan.md)."""

    def __init__(
        self,
        config: dict[str, Any],
        own: list[dict[str, Any]],
        timings: str | Path | None,
        gpu: str | None = None,
        interconnect: dict[str, float] | None = None,
    ):
        """`own`: this folder's benchmarks as job rows (`b`); `timings`: the records folder."""
        self.config = config
        self.own = [job for job in map(job_row, own) if job is not None]
        self.records = recorded_jobs(timings)
        self.cpu, self.gpu = books(timings or "", gpu, interconnect)
        self.works: dict[tuple[str, tuple[tuple[str, str], ...]], Work | None] = {}
        self.reasons: dict[str, str] = {}

    def work(self, job: DagJob) -> Work | None:
        """The job's planned work (None: no work model, or its inputs are not here)."""
        key = (job.rule, tuple(sorted(job.wildcards.items())))
        if key not in self.works:
            self.works[key] = None
            try:
                self.works[key] = counted_work(job.rule, self.config, job.wildcards)
            except NotHere as error:
                self.reasons[job.rule] = str(error)
            except (GpuflowError, OSError) as error:
                self.reasons[job.rule] = f"its work could not be counted: {error}"
            if self.works[key] is None and job.rule not in self.reasons:
                self.reasons[job.rule] = "no work model for this rule"
        return self.works[key]

    def predict(self, job: DagJob) -> Prediction:
        """The job's expected seconds and where they come from."""
        work = self.work(job)
        book = self.gpu if gpus_of(job) else self.cpu
        sources = [("b", "bench", self.own)] if work or not has_work_model(job.rule) else []
        sources += [("m", name, jobs) for name, _, jobs in self.records]
        for letter, name, jobs in sources:
            found = from_jobs(job.rule, job.wildcards, job.params, work, jobs, book, letter, name)
            if found is not None:
                return found
        if work is not None:
            expected = predict(work, book)
            if isinstance(expected, Prediction):
                return expected
            self.reasons[job.rule] = missing_reason(expected, book)
        limit = runtime_s(job)
        return Prediction(limit, limit, limit, "r", notes=(self.reasons.get(job.rule, ""),))

    def other_params(self, jobs: list[DagJob]) -> int:
        """How many of this folder's benchmarks of the rule ran with params none of `jobs` has."""
        params = {job.params for job in jobs}
        return sum(1 for o in self.own if o["rule"] == jobs[0].rule and o["params"] not in params)

    def devices(self, name: str) -> str:
        """What the record `name` was measured on."""
        return next((", ".join(devices) for n, devices, _ in self.records if n == name), "?")
