"""The CPU cores this process may use, and their share per worker (torch-free)."""

from __future__ import annotations

import os


def threads_per_worker(n_workers: int) -> int:
    """CPU threads each of `n_workers` worker processes may use without oversubscribing."""
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (available or 1) // max(1, n_workers))
