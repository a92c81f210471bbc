"""Records of gpu-check runs: one small JSON per run (date, device), each compared with the last.

A record (gpuflow.cost.records' format) holds where the run happened (device class, devices,
driver, torch and CUDA versions, commit), the sections it ran and every row. `make gpu-check`
writes one into benchmarks/records/ and prints the change of each row's rate and share of peak
against the latest earlier record of a whole run on the same device. A run of some sections
only (`--sections`) is named after them, so it never replaces a whole run's record.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_check.sections import SECTIONS
from gpuflow.cost.records import device_slug, environment
from gpuflow.job.atomic import write_json

PREFIX = re.compile(r"^\d{4}-\d{2}-\d{2}-")


def record_path(
    folder: Path,
    devices: list[torch.device],
    when: datetime.datetime,
    sections: Sequence[str] = SECTIONS,
) -> Path:
    """`<folder>/<YYYY-MM-DD>-<device slug>.json` for a whole run, `...-<section>-....json` for
    some sections (a second run of the same on one day replaces the first)."""
    part = "" if set(sections) == set(SECTIONS) else "-" + "-".join(sections)
    return Path(folder) / f"{when.date().isoformat()}-{device_slug(devices)}{part}.json"


def latest_record(folder: Path, slug: str) -> Path | None:
    """The newest record of the devices `slug` in `folder` (by the date in its name)."""
    found = sorted(
        path
        for path in Path(folder).glob(f"*-{slug}.json")
        if PREFIX.match(path.name) and path.name[11:-5] == slug
    )
    return found[-1] if found else None


def _ratio(new: float | None, old: float | None) -> str:
    if new is None or old is None or old == 0:
        return "-"
    return f"{new / old:.2f}x"


def compare(
    previous: dict[str, Any], rows: list[dict[str, Any]], of_whole_run: bool = True
) -> list[str]:
    """One line per row: its rate and share of peak now against `previous`, ok changes flagged;
    then the rows only one of the two has (of a run of some sections: only its new rows)."""
    before = {row["path"]: row for row in previous["rows"]}
    lines = [f"{'path':70s} {'rate now/then':>13s} {'% peak then':>11s} {'% peak now':>10s}  ok"]
    for row in rows:
        old = before.get(row["path"])
        if old is None:
            continue
        share_then, share_now = old.get("share_of_peak"), row.get("share_of_peak")
        then = f"{100 * share_then:.1f}" if share_then is not None else "-"
        now = f"{100 * share_now:.1f}" if share_now is not None else "-"
        ok = "yes" if row["ok"] else "NO"
        if row["ok"] != old["ok"]:
            ok += f" (was {'yes' if old['ok'] else 'NO'})"
        lines.append(
            f"{row['path'][:70]:70s} {_ratio(row['throughput'], old['throughput']):>13s} "
            f"{then:>11s} {now:>10s}  {ok}"
        )
    paths = {row["path"] for row in rows}
    lines += [f"new row: {row['path']}" for row in rows if row["path"] not in before]
    if of_whole_run:
        lines += [f"row gone: {path}" for path in before if path not in paths]
    return lines


def save_and_compare(
    folder: Path,
    rows: list[dict[str, Any]],
    devices: list[torch.device],
    checkout: Path,
    when: datetime.datetime | None = None,
    sections: Sequence[str] = SECTIONS,
) -> tuple[Path, list[str]]:
    """Write this run's record into `folder`; return its path and the comparison lines against
    the latest earlier record of a whole run on the same devices (one line saying so when
    there is none). The earlier record is read first: a second run on one day replaces that
    day's record."""
    when = when or datetime.datetime.now(datetime.UTC)
    path = record_path(folder, devices, when, sections)
    previous = latest_record(folder, device_slug(devices))
    earlier = json.loads(previous.read_text()) if previous is not None else None
    env = environment(devices, checkout)
    created = when.isoformat(timespec="seconds")
    write_json(path, {"created": created, **env, "sections": list(sections), "rows": rows})
    if earlier is None:
        return path, [f"no earlier record of {device_slug(devices)} in {folder} to compare with"]
    header = f"change against {previous.name} of {earlier['created']} (rate: now / then):"
    return path, [header, *compare(earlier, rows, set(sections) == set(SECTIONS))]
