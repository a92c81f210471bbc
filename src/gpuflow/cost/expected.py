"""Every planned job's expected time, from the best source there is (gpuflow.cost.predict):

1. `b`: this folder's benchmark files of the rule's jobs that ran with the job's params;
2. `m`: the newest committed timings record (`gpuflow record-timings`) that measured them;
3. `w`: the work model at the rates of the job's device (gpu-check and calibration records);
4. `r`: the rule's runtime limit, with the reason none of these applies.

Benchmarks of a rule with a work model are scaled by the job's work over the work the
benchmarked job did (read from its outputs, or fixed by its params): the same params on other
inputs (other texts, another data size) are never reused as they are. Rules without a work
model scale by their size-like numeric wildcards (SIZE_WILDCARDS). GPU jobs use the rates of
the GPU class named (`--gpu`, the site's gpu_model) or the newest one with records; other jobs
this machine's CPU class.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gpuflow.cost.predict import Missing, Prediction, from_benchmarks, predict
from gpuflow.cost.rates import RateBook, books
from gpuflow.cost.rules import counted_work, has_work_model, params_fix_work
from gpuflow.cost.work import STARTUP, NotHere, Work
from gpuflow.errors import GpuflowError
from gpuflow.ops.snakemake_adapter import Dag, DagJob
from gpuflow.ops.timings import measured
from gpuflow.ops.timings import records as timings_records

# Not a label fraction: an SSVAE epoch walks the unlabelled digits, so its time hardly moves
# with the labelled share (5,000 labels of 50,000: 450 steps an epoch against 499 at 100).
SIZE_WILDCARDS = ("n", "size", "samples", "steps", "epochs", "tokens", "texts")


def gpus_of(job: DagJob) -> int:
    """GPUs of the whole job: `gpu`, or nodes x the GPUs per node of `gres` (gpu:N or
    gpu:<model>:N, as sbatch --gres counts them) for multi-node rules."""
    gres = str(job.resources.get("gres", ""))
    per_node = re.search(r"\bgpu(?::[^:,]+)?:(\d+)", gres)
    if per_node:
        return int(float(job.resources.get("nodes", 1) or 1)) * int(per_node[1])
    return int(float(job.resources.get("gpu", 0) or 0))


def runtime_s(job: DagJob) -> float:
    """The job's time limit (first attempt) in seconds."""
    return float(job.resources.get("runtime", 0) or 0) * 60


def wildcard_pattern(path: str, wildcards: dict[str, str]) -> tuple[str, re.Pattern[str]]:
    """A glob over `path` for any wildcard values, and a regex reading them back.

    Wildcards appear as `name~value` (Paramspace style) or as a value found once in the path.
    """
    pattern, regex = path, re.escape(path)
    for name, value in wildcards.items():
        token = f"{name}~{value}"
        if path.count(token) == 1:
            old, prefix = token, f"{name}~"
        elif value and path.count(value) == 1:
            old, prefix = value, ""
        else:
            continue
        pattern = pattern.replace(old, f"{prefix}*")
        regex = regex.replace(re.escape(old), re.escape(prefix) + f"(?P<{name}>[^/]+)")
    return pattern, re.compile(regex + "$")


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


class Expected:
    """Expected times of a DAG's jobs (see the module's docstring); each rule's benchmarks
    are searched once per params."""

    def __init__(
        self,
        dag: Dag,
        directory: str,
        timings: str | None,
        gpu: str | None = None,
        own: bool = True,
    ):
        """`own`: use this folder's benchmarks (`b`); the ledger does not, they are what a run
        spent."""
        self.dag = dag
        self.directory = Path(directory)
        self.own = measured(dag, self.directory)[0] if own else {}
        self.records = timings_records(Path(timings)) if timings else []
        self.cpu, self.gpu = books(timings or "", gpu)
        self.works: dict[tuple[str, tuple[tuple[str, str], ...]], Work | None] = {}
        self.reasons: dict[str, str] = {}

    def work(self, job: DagJob) -> Work | None:
        """The job's planned work (None: no work model, or its inputs are not here)."""
        key = (job.rule, tuple(sorted(job.wildcards.items())))
        if key not in self.works:
            self.works[key] = None
            try:
                self.works[key] = counted_work(job.rule, self.dag.config, job.wildcards)
            except NotHere as error:
                self.reasons[job.rule] = str(error)
            except (GpuflowError, OSError) as error:
                self.reasons[job.rule] = f"its work could not be counted: {error}"
            if self.works[key] is None and job.rule not in self.reasons:
                self.reasons[job.rule] = (
                    "its inputs (data files, model) are not readable here"
                    if has_work_model(job.rule)
                    else "no work model for this rule"
                )
        return self.works[key]

    def samples(
        self, job: DagJob, entries: dict[str, dict[str, Any]]
    ) -> list[tuple[float, Work | None, float]]:
        """(seconds, the work it measured or None where the params fix it, its size) of every
        benchmark in `entries` (gpuflow.ops.timings.measured: seconds, params and the work the
        job did, where known) of the job's rule: those with the job's params, and, for a rule
        with a work model, those of other params that did work of the same kinds and shapes
        (so at the same rates: 150 epochs of the same model say what 75 cost). Benchmarks
        whose work is unknown are left out."""
        if not job.benchmark:
            return []
        regex = wildcard_pattern(job.benchmark, job.wildcards)[1]
        modelled = has_work_model(job.rule)
        found = []
        for path, entry in entries.items():
            match = regex.match(path)
            if match is None:
                continue
            same = entry["params"] == job.params
            work = Work.from_dict(entry["work"]) if modelled and "work" in entry else None
            if modelled and not (same and params_fix_work(job.rule)):
                if work is None or (not same and not alike(work, self.work(job))):
                    continue
            elif not same:
                continue
            found.append((entry["seconds"], work, size_of(match.groupdict())))
        return found

    def predict(self, job: DagJob) -> Prediction:
        """The job's expected seconds and where they come from."""
        work = self.work(job)
        book = self.gpu if gpus_of(job) else self.cpu
        sources = [("b", "bench", self.own)]
        if work is None and has_work_model(job.rule) and not params_fix_work(job.rule):
            sources = []  # earlier jobs' times cannot be scaled to work that is not known
        sources += [("m", name, record["benchmarks"]) for name, record in self.records]
        for letter, name, entries in sources:
            found = self.samples(job, entries)
            if not found:
                continue
            if work is not None:
                pairs = [(seconds, done) for seconds, done, _ in found]
                expected = from_benchmarks(pairs, work, book, letter, name)
                if expected is not None:
                    return expected
                continue
            size = size_of(job.wildcards)
            scaled = [seconds * size / measured_size for seconds, _, measured_size in found]
            mean = sum(scaled) / len(scaled)
            return Prediction(mean, min(scaled), max(scaled), letter, (name,))
        if work is not None:
            expected = predict(work, book)
            if isinstance(expected, Prediction):
                return expected
            self.reasons[job.rule] = missing_reason(expected, book)
        limit = runtime_s(job)
        return Prediction(limit, limit, limit, "r", notes=(self.reasons.get(job.rule, ""),))

    def other_params(self, jobs: list[DagJob]) -> int:
        """How many of this folder's benchmark files of the rule of `jobs` ran with params none
        of them has (left out of their expected time: 5 epochs say nothing of 75)."""
        if not jobs[0].benchmark:
            return 0
        regex = wildcard_pattern(jobs[0].benchmark, jobs[0].wildcards)[1]
        params = {job.params for job in jobs}
        return sum(1 for p, e in self.own.items() if e["params"] not in params and regex.match(p))

    def devices(self, name: str) -> str:
        """What the timings record `name` was measured on."""
        found = (", ".join(r.get("devices") or ["?"]) for n, r in self.records if n == name)
        return next(found, "?")


def alike(done: Work, planned: Work | None) -> bool:
    """Whether two works are of the same kinds at the same shapes, start-ups aside (the same
    rates apply to what they compute)."""

    def shapes(work: Work) -> set[tuple[str, str]]:
        return {(t.kind, t.shape) for t in work.terms if t.kind != STARTUP}

    return planned is not None and shapes(done) == shapes(planned)


def missing_reason(missing: Missing, book: RateBook) -> str:
    """Why a work model gave no time, and the calibration that would give one."""
    kinds = ", ".join(dict.fromkeys(kind.split(" at ")[0] for kind in missing.kinds))
    if (book.device or "").startswith("cpu"):
        return f"no {kinds} rate here: run `gpuflow calibrate` with this config"
    where = f"a {book.device} node" if book.device else "a GPU node"
    return f"no {kinds} rate on {book.device or 'a GPU'}: run `gpuflow calibrate` on {where}"
