"""One row of the GPU check: what ran, whether it was right, and how fast against the peak."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class CheckRow:
    """A checked path: `ok` means its numbers matched the reference within `tolerance`."""

    path: str
    ok: bool
    tolerance: str
    deviation: str
    throughput: float | None = None
    unit: str = ""
    tflops: float | None = None
    peak_tflops: float | None = None
    seconds: float = 0.0
    devices: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    rate: dict[str, Any] | None = None  # the rate gpuflow plan reads (gpuflow.cost.rates)

    def rated(self, kind: str, shape: str) -> CheckRow:
        """This row with the rate it measured of `kind` at `shape`: its FLOP/s where it counts
        FLOPs, else its throughput."""
        from gpuflow.cost.records import rate_field

        if self.tflops is not None:
            self.rate = rate_field(kind, shape, "FLOP/s", [self.tflops * 1e12])
        elif self.throughput is not None:
            self.rate = rate_field(kind, shape, self.unit, [self.throughput])
        return self

    @property
    def share_of_peak(self) -> float | None:
        """Achieved FLOP rate as a fraction of the device's measured matmul peak."""
        if self.tflops is None or not self.peak_tflops:
            return None
        return self.tflops / self.peak_tflops

    def as_dict(self) -> dict[str, Any]:
        """The row as JSON-ready data, the share of peak included."""
        return {**asdict(self), "share_of_peak": self.share_of_peak}


def failed_row(path: str, error: BaseException, seconds: float) -> CheckRow:
    """The row of a path that raised: not ok, with the error as its deviation."""
    return CheckRow(
        path=path,
        ok=False,
        tolerance="runs to the end",
        deviation=f"{type(error).__name__}: {error}"[:400],
        seconds=seconds,
    )


def max_relative_difference(values: Any, reference: Any) -> float:
    """max |values - reference| / |reference| over paired numbers (0 for none)."""
    pairs = zip(values, reference, strict=True)
    return max((abs(v - r) / max(abs(r), 1e-30) for v, r in pairs), default=0.0)
