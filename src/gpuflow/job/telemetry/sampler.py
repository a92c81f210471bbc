"""The sampler thread: every `interval_s` it reads the job's GPUs and its process tree."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from gpuflow.job.telemetry.nvml import MB, Gpus
from gpuflow.job.telemetry.processes import ProcessTree, allotted_cores


class Sampler:
    """A daemon thread sampling `root`'s process tree and the GPUs `visible` names."""

    def __init__(self, root: int, interval_s: float, visible: str | None, nodes: int = 1) -> None:
        self.interval_s = interval_s
        self.nodes = nodes
        self.cores = allotted_cores()
        self.tree = ProcessTree(root)
        self.gpus = Gpus(visible)
        self.samples = 0
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuflow-telemetry", daemon=True)

    def start(self) -> Sampler:
        self.sample()
        self._thread.start()
        return self

    def sample(self) -> None:
        with self._lock:
            self.tree.sample()
            self.gpus.sample(self.interval_s)
            self.samples += 1

    def sample_processes(self) -> None:
        """Read the process tree now (CPU time is cumulative, so an extra look biases nothing;
        GPU readings stay on the interval, whose means they are)."""
        with self._lock:
            self.tree.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            self.sample()
        self.gpus.close()

    def summary(self) -> dict[str, Any]:
        """Wall time, CPU use (cores busy, % of the allotted cores, peak RSS) and GPU use."""
        with self._lock:
            wall = time.monotonic() - self.started
            busy = self.tree.cpu_seconds / wall if wall > 0 else 0.0
            return {
                "wall_s": wall,
                "interval_s": self.interval_s,
                "samples": self.samples,
                "host_pid": f"{os.uname().nodename}:{self.tree.root}",
                "cpu": {
                    "allotted_cores": self.cores,
                    "cpu_seconds": self.tree.cpu_seconds,
                    "cores_busy_mean": busy,
                    "util_percent_mean": 100 * busy / self.cores,
                    "peak_rss_mb": self.tree.peak_rss_bytes / MB,
                    "peak_processes": self.tree.peak_processes,
                },
                "gpu": self.gpus.summary(wall, self.nodes),
            }
