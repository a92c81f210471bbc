"""gpuflow's SLURM executor: snakemake-executor-plugin-slurm 2.8 with four faults fixed."""

# No `from __future__ import annotations`: the settings fields' types must be real (argparse).

import asyncio
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import snakemake_executor_plugin_slurm as base
from snakemake_executor_plugin_slurm import common_settings, partitions
from snakemake_interface_common.exceptions import WorkflowError

from gpuflow.slurm.queue import ACTIVE

__all__ = ["Executor", "ExecutorSettings", "common_settings", "gpus_per_node", "read_partitions"]

SUPPORTED = ("2.8",)  # minor releases of snakemake-executor-plugin-slurm read here
JOBSTEP_SUPPORTED = "0.6."  # of snakemake-executor-plugin-slurm-jobstep (forward_step_signals)
TRANSIENT = re.compile(
    r"Unable to contact slurm controller|connect failure|Socket timed out|Connection refused"
    r"|temporarily unavailable|temporarily unable|Zero Bytes were transmitted"
    r"|Problem talking to the database|slurm_persist_conn|Communication connection failure"
    r"|Transport endpoint is not connected|backup controller in standby mode",
    re.IGNORECASE,
)
STILL_ON = ACTIVE | {"STOPPED"}
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
LONGEST_PAUSE_S = 30.0


def check_version(found: str | None = None) -> None:
    """Stop with one line unless the installed SLURM plugin is a SUPPORTED release."""
    found = found or version("snakemake-executor-plugin-slurm")
    if ".".join(found.split(".")[:2]) not in SUPPORTED:
        wanted = ", ".join(f"{release}.x" for release in SUPPORTED)
        raise WorkflowError(
            f"gpuflow's SLURM executor extends snakemake-executor-plugin-slurm {wanted}, found"
            f" {found}: install a supported one (pip install 'snakemake-executor-plugin-slurm"
            f"=={SUPPORTED[-1]}.*')"
        )


def read_partitions(site_file: Path) -> list[Any]:
    """The site file's partitions, as the plugin reads them to place jobs."""
    check_version()
    return partitions.read_partition_file(site_file)


def gpus_per_node(job: Any) -> int:
    """GPUs per node of a job (its `gpu`, else its `gres`'s count), as the plugin counts them."""
    return partitions.parse_gpu_requirements(job)[0]


def forward_step_signals() -> None:
    """Inside a SLURM job: start each job step's Snakemake under gpuflow.job.forward."""
    import snakemake_executor_plugin_slurm_jobstep as jobstep

    found = version("snakemake-executor-plugin-slurm-jobstep")
    if not found.startswith(JOBSTEP_SUPPORTED):
        raise WorkflowError(
            f"gpuflow's SLURM executor extends snakemake-executor-plugin-slurm-jobstep"
            f" {JOBSTEP_SUPPORTED}x, found {found}: install a supported one"
        )
    if getattr(jobstep.Executor.get_python_executable, "forwarded", False):
        return

    def forwarded(executor: jobstep.Executor) -> str:
        python = shlex.quote(sys.executable)
        return f"{python} -m gpuflow.job.forward -- {python}"

    forwarded.forwarded = True  # type: ignore[attr-defined]
    jobstep.Executor.get_python_executable = forwarded


def job_state(reported: str, requeue: bool) -> str:
    """The state the plugin acts on for a state SLURM reported (unknown ones FAILED)."""
    words = reported.split()
    word = words[0].rstrip("+").upper() if words else ""
    if word in STILL_ON or word in ENDED or (requeue and word in ("PREEMPTED", "NODE_FAIL")):
        return word
    return "FAILED"


def node_names(text: str) -> list[str]:
    """Node names in sacct's NodeList text (hostlists expanded); non-names left out."""
    names = []
    for part in text.replace("None assigned", " ").split():
        hosts = [part]
        if "[" in part:
            done = subprocess.run(
                ["scontrol", "show", "hostnames", part], capture_output=True, text=True, check=False
            )
            hosts = done.stdout.split() if done.returncode == 0 else []
        names += [host for host in hosts if NODE_NAME.match(host) and host != "None"]
    return names


class FailedNodes(set):
    """The nodes later submissions exclude: node names whose partitions keep another up."""

    def __init__(self, setting: str | None):
        super().__init__()
        self.add((setting or "").replace(",", " "))

    def add(self, text: str) -> None:
        for name in node_names(str(text)):
            super().add(name)

    def excluded(self) -> list[str]:
        """The failed nodes to exclude now."""
        failed = set(set.__iter__(self))
        if not failed:
            return []
        done = subprocess.run(
            ["sinfo", "--noheader", "--format=%R %n %t"],
            capture_output=True, text=True, check=False, timeout=30,
        )  # fmt: skip
        rows = [line.split() for line in done.stdout.splitlines() if len(line.split()) == 3]
        up: dict[str, set[str]] = {}
        of: dict[str, set[str]] = {}
        for partition, node, state in rows:
            of.setdefault(node, set()).add(partition)
            down = state.startswith(("down", "drain", "fail", "maint")) or state.endswith("*")
            if not down:  # a state ending in * does not respond
                up.setdefault(partition, set()).add(node)
        return sorted(
            node
            for node in failed
            if all(up.get(partition, set()) - failed for partition in of.get(node, ()))
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self.excluded())

    def __bool__(self) -> bool:
        return bool(self.excluded())


@dataclass
class ExecutorSettings(base.ExecutorSettings):
    """The SLURM plugin's settings, and how long a controller outage is waited out."""

    outage_minutes: float = field(
        default=5.0,
        metadata={
            "help": "Minutes to wait out a SLURM controller that does not answer (failed "
            "status queries and submissions are tried again meanwhile) before the run stops",
            "env_var": False,
            "required": False,
        },
    )


class Outage:
    """One stretch of failed SLURM calls: when it began, and the one line that ends a run."""

    def __init__(self, minutes: float, logger):
        self.limit_s, self.logger = 60 * minutes, logger
        self.since: float | None = None
        self.said = 0.0
        self.lock = threading.Lock()

    def failed(self, what: str, error: str) -> float:
        """Note a failure; the pause before the next try, or raise past the limit."""
        now = time.monotonic()
        with self.lock:
            self.since = self.since or now
            waited = now - self.since
            if waited > self.limit_s:
                raise WorkflowError(
                    f"SLURM did not answer for {waited / 60:.1f} minutes ({what}: {error.strip()}"
                    "): the run stops; its SLURM jobs go on. Once the controller answers, run "
                    "the same command again: it resumes (it names the jobs still running, to "
                    "wait for or scancel first)."
                )
            if now - self.said > 60:
                self.said = now
                left = (self.limit_s - waited) / 60
                self.logger.warning(
                    f"SLURM does not answer ({what}: {error.strip()}); trying again for up to "
                    f"{left:.1f} more minutes"
                )
        return min(LONGEST_PAUSE_S, 2.0 * 2 ** min(10, int(waited // 10)))

    def over(self) -> None:
        with self.lock:
            if self.since is not None:
                self.logger.info("SLURM answers again")
            self.since = None


class Executor(base.Executor):
    """The plugin's executor with the fixes above."""

    def __post_init__(self, test_mode: bool = False):
        check_version()
        super().__post_init__(test_mode)
        settings = self.workflow.executor_settings
        self._failed_nodes = FailedNodes(settings.exclude_failed_nodes)
        self._outage = Outage(settings.outage_minutes, self.logger)
        self._captured = threading.local()
        self._stopping = threading.Event()
        base.query_job_status = self.query_job_status  # the status loop's one query

    # --- status ----------------------------------------------------------------------------
    async def query_job_status(self, command: str, logger) -> tuple[dict[str, str], float]:
        """The states of the run's jobs, the query tried again while SLURM does not answer."""
        while True:
            began = time.time()
            process = await asyncio.create_subprocess_exec(
                *shlex.split(command),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                out, err = await asyncio.wait_for(process.communicate(), timeout=60)
            except TimeoutError:
                process.kill()
                out, err = b"", b"timed out after 60 s"
            if process.returncode == 0:
                break
            await asyncio.sleep(self._outage.failed(command.split()[0], err.decode()))
        self._outage.over()
        requeue = bool(self.workflow.executor_settings.requeue)
        states = {}
        for line in out.decode().splitlines():
            job_id, _, reported = line.partition("|")
            if job_id.strip():
                states[job_id.strip()] = job_state(reported.strip(), requeue)
                if states[job_id.strip()] == "NODE_FAIL":
                    self._failed_nodes.add(failed_node(job_id.strip()))
        return states, time.time() - began

    # --- submission ------------------------------------------------------------------------
    def run_job(self, job) -> None:
        self._submitted([job], lambda jobs: super(Executor, self).run_job(jobs[0]))

    def run_array_jobs(self, jobs) -> None:
        self._submitted(list(jobs), lambda batch: super(Executor, self).run_array_jobs(batch))

    def _submitted(self, jobs: list, submit) -> None:
        """Submit `jobs`, those refused for want of the controller again after a pause."""
        while jobs and not self._stopping.is_set():
            self._captured.errors = []
            try:
                submit(jobs)
            finally:
                errors, self._captured.errors = self._captured.errors, None
            retry = [(info, msg) for info, msg in errors if TRANSIENT.search(msg)]
            for info, msg in errors:
                if (info, msg) not in retry:
                    super()._report_job_error_threadsafe(info, msg)
            if not retry:
                self._outage.over()
                return
            try:
                pause = self._outage.failed("sbatch", TRANSIENT.search(retry[0][1])[0])
            except WorkflowError as error:
                self._stop_run(error)
                return
            if self._stopping.wait(pause):
                return
            jobs = [info.job for info, _ in retry]
            self._cancel_twins(jobs)

    def _stop_run(self, error: WorkflowError) -> None:
        """End the run as Snakemake ends it on an executor error: no job reported failed."""
        self._stopping.set()
        self.workflow.scheduler.executor_error_callback(WorkflowError(str(error)))

    def _report_job_error_threadsafe(self, job_info, msg: str) -> None:
        captured = getattr(self._captured, "errors", None)
        if captured is not None:
            captured.append((job_info, msg))
        else:
            super()._report_job_error_threadsafe(job_info, msg)

    def _cancel_twins(self, jobs: Iterable) -> None:
        """Cancel jobs a timed-out submission may have queued after all (the same comment)."""
        comments = {f"rule_{job.name}_wildcards_{base.get_job_wildcards(job)}" for job in jobs}
        comments |= {f"rule_{job.name}" for job in jobs if not base.get_job_wildcards(job)}
        listed = subprocess.run(
            ["squeue", "--noheader", "--format=%i|%k", f"--name={self.run_uuid}"],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        tracked = {str(info.external_jobid) for info in self.active_jobs}
        twins = [
            job_id
            for job_id, _, comment in (line.partition("|") for line in listed.stdout.splitlines())
            if comment in comments and job_id not in tracked
        ]
        if twins:
            self.logger.warning(f"cancelling SLURM jobs {twins} queued by a timed-out sbatch")
            subprocess.run(["scancel", *twins], check=False, timeout=60)

    def shutdown(self) -> None:
        self._stopping.set()
        super().shutdown()

    def cancel(self) -> None:
        self._stopping.set()
        super().cancel()


def failed_node(job_id: str) -> str:
    """The nodes a job held when it ended NODE_FAIL, from its NODE_FAIL record."""
    done = subprocess.run(
        ["sacct", "-j", job_id, "-X", "-n", "-P", "-D", "--format=NodeList,State"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    rows = [line.split("|") for line in done.stdout.splitlines() if "|" in line]
    return " ".join(nodes for nodes, state in rows if state.startswith("NODE_FAIL"))
