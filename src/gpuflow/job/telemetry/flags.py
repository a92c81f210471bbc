"""Which jobs used their devices poorly, and the reason their own timings give."""

from __future__ import annotations

from typing import Any

SHARE_THRESHOLD = 0.25
TINY_STEP_S = 0.01


def utilisation(summary: dict[str, Any]) -> tuple[str, float | None]:
    """('gpu', mean SM %) when the job had GPUs, else ('cpu', % of allotted cores busy)."""
    gpu = summary.get("gpu") or {}
    if gpu.get("count"):
        return "gpu", gpu.get("sm_util_mean")
    return "cpu", (summary.get("cpu") or {}).get("util_percent_mean")


def likely_reason(summary: dict[str, Any]) -> str:
    """The cause the job's own timings point to, or a line saying they point to none."""
    timings = summary.get("timings") or {}
    wall = summary.get("wall_s") or 0.0
    shares = {}
    if "data_wait_s" in timings and wall > 0:
        shares["data loading"] = timings["data_wait_s"] / wall
    if "comm_exposed_share" in timings:
        shares["waiting on communication"] = timings["comm_exposed_share"]
    if shares:
        cause, share = max(shares.items(), key=lambda item: item[1])
        if share >= SHARE_THRESHOLD:
            return f"{cause} ({100 * share:.0f}% of the time)"
    step = timings.get("step_s")
    if step is not None and step < TINY_STEP_S:
        batch = timings.get("batch_size")
        size = f"batches of {batch:.0f}, " if batch is not None else ""
        return f"tiny batches ({size}{1000 * step:.1f} ms a step)"
    return "no timing of the job explains it"


def flag(summary: dict[str, Any], threshold: float) -> str:
    """'' for a job at or above the threshold (or unmeasured), else 'LOW: <reason>'."""
    _, util = utilisation(summary)
    if util is None or util >= threshold:
        return ""
    return f"LOW: {likely_reason(summary)}"
