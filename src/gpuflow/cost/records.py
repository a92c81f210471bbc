"""Records: what was measured on a device class, in one format, as small JSON files."""

from __future__ import annotations

import datetime
import json
import os
import re
import statistics
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

RECORDS_ENV = "GPUFLOW_RECORDS"  # where the records are, where not benchmarks/records
DATED = re.compile(r"^\d{4}-\d{2}-\d{2}-.+\.json$")


@dataclass(frozen=True)
class Record:
    """One record file: its name, when it was made, its device class and devices, and its rows."""

    name: str
    created: str
    device_class: str
    devices: tuple[str, ...]
    rows: tuple[dict[str, Any], ...]


def rate_records(checkout: str | Path = ".") -> Path:
    """The records folder: $GPUFLOW_RECORDS, else the checkout's benchmarks/records."""
    return Path(os.environ.get(RECORDS_ENV) or Path(checkout) / "benchmarks" / "records")


def read_records(folder: str | Path) -> list[Record]:
    """Every readable record in `folder` with a device class and rows, newest first."""
    folder = Path(folder)
    facts = tuple(
        (path.name, path.stat().st_mtime_ns)
        for path in sorted(folder.glob("*.json"))
        if DATED.match(path.name)
    )
    return _read(folder, facts)


@cache
def _read(folder: Path, facts: tuple[tuple[str, int], ...]) -> list[Record]:
    found = []
    for name, _ in facts:
        try:
            data = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            continue
        devices = data.get("devices")
        named = isinstance(devices, list) and all(isinstance(d, str) for d in devices)
        if isinstance(data.get("device_class"), str):
            rows = tuple(row for row in data["rows"] if isinstance(row, dict))
            created = str(data.get("created") or name[:10])
            found.append(
                Record(
                    name, created, data["device_class"], tuple(devices if named else ["?"]), rows
                )
            )
    return sorted(found, key=lambda record: (record.created, record.name), reverse=True)


def rate_field(kind: str, shape: str, unit: str, trials: list[float]) -> dict[str, Any]:
    """The `rate` of a row: `kind` at `shape`, the median of `trials` (per second)."""
    value = statistics.median(trials)
    return {"kind": kind, "shape": shape, "unit": unit, "value": value, "trials": trials}


def slug(name: str) -> str:
    """A device name as records name it: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def this_cpu() -> str:
    """This machine's CPU as a device class: 'cpu-<model>-<n>c' (cores this process may use)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    models = (line.split(":", 1)[1] for line in lines if line.startswith("model name"))
    name = slug(next(models, "cpu"))
    cores = len(os.sched_getaffinity(0))
    return f"{name}-{cores}c" if name.startswith("cpu") else f"cpu-{name}-{cores}c"


def device_class(device: Any) -> str:
    """The device class of a torch device: this CPU's, or the GPU's name as a slug."""
    if device.type == "cpu":
        return this_cpu()
    import torch

    return slug(torch.cuda.get_device_name(device))


def device_slug(devices: list[Any]) -> str:
    """A file-name part for the devices: e.g. '2x-nvidia-h100-80gb-hbm3' or the CPU's class."""
    names = sorted({device_class(device) for device in devices})
    part = "+".join(names)
    return f"{len(devices)}x-{part}" if len(devices) > 1 else part


def driver_version() -> str | None:
    """The NVIDIA driver's version from NVML, or None without one."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library: nothing to record
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def git_commit(folder: Path) -> str | None:
    """HEAD's commit of the checkout at `folder`, '+dirty' when files differ; None outside git."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(folder), *args], capture_output=True, text=True, check=True
        )
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+dirty" if dirty else "")


def environment(devices: list[Any], folder: Path) -> dict[str, Any]:
    """Where a measurement happened: device class, devices, driver, library versions, commit."""
    import torch

    from gpuflow.job.devices import describe_device

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "device_class": device_class(devices[0]),
        "devices": [describe_device(d) for d in devices],
        "driver": driver_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "commit": git_commit(folder),
    }


def row_key(row: dict[str, Any]) -> tuple[str, ...]:
    """What a row measured: a rate's kind and shape, or a job's benchmark path."""
    if "rate" in row:
        return ("rate", str(row["rate"].get("kind")), str(row["rate"].get("shape")))
    return ("job", str(row.get("path")))


def add_rows(
    out: Path, env: dict[str, Any], rows: list[dict[str, Any]], **more: Any
) -> dict[str, Any]:
    """Write `rows` into the record `out`, keeping its rows these do not measure again."""
    from gpuflow.job.atomic import write_json

    earlier = json.loads(out.read_text()) if out.exists() else {"rows": []}
    measured = {row_key(row) for row in rows}
    kept = [row for row in earlier.get("rows", []) if row_key(row) not in measured]
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    record = {"created": when, **env, **more, "rows": kept + rows}
    write_json(out, record)
    return record


def dated(folder: str | Path, part: str, suffix: str) -> Path:
    """Today's record of `part` (a device class) and `suffix` in `folder`."""
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    return Path(folder) / f"{today}-{part}{suffix}.json"
