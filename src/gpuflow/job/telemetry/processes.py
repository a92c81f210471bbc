"""CPU time and memory of a process tree (a job's step, its workers, torchrun ranks), via psutil."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import psutil


def allotted_cores() -> int:
    """The cores this job may use: its CPU affinity, capped by SLURM's CPUs on this node."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    slurm = os.environ.get("SLURM_CPUS_ON_NODE", "")
    if slurm.isdigit() and int(slurm) > 0:
        cores = min(cores or int(slurm), int(slurm))
    return max(1, cores or 1)


@dataclass
class ProcessTree:
    """Cumulative CPU seconds and peak resident memory of `root` and all its descendants."""

    root: int
    cpu_seconds: float = 0.0
    peak_rss_bytes: int = 0
    peak_processes: int = 0
    _seen: dict[tuple[int, float], float] = field(default_factory=dict)

    def sample(self) -> None:
        """Read every process of the tree once."""
        try:
            top = psutil.Process(self.root)
            processes = [top, *top.children(recursive=True)]
        except psutil.Error:
            return
        rss, alive = 0, 0
        first = not self._seen
        for process in processes:
            try:
                with process.oneshot():
                    times = process.cpu_times()
                    memory = process.memory_info().rss
                    key = (process.pid, process.create_time())
            except psutil.Error:
                continue
            used = times.user + times.system
            before = self._seen.get(key, used if first else 0.0)
            self.cpu_seconds += max(0.0, used - before)
            self._seen[key] = used
            rss += memory
            alive += 1
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        self.peak_processes = max(self.peak_processes, alive)
