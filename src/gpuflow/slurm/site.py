"""The SLURM site file (profiles/slurm/site.yaml): partitions, stop warning, default account."""

from __future__ import annotations

import copy
import getpass
import os
import shlex
import shutil
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from gpuflow.errors import ConfigError, DataError
from gpuflow.settings.files import safe_yaml
from gpuflow.slurm.site_check import run_command

SITE_ENV = "GPUFLOW_SLURM_SITE"
DEFAULT_SITE = "profiles/slurm/site.yaml"
# Site keys that reach every job's sbatch through the profile's slurm_extra, and their options.
SBATCH_EXTRA = {
    "reservation": "--reservation",
    "mail_type": "--mail-type",
    "mail_user": "--mail-user",
}


def site_path(basedir: str | Path | None = None) -> str:
    """The site file in use, absolute: $GPUFLOW_SLURM_SITE, else the workflow's."""
    return os.path.abspath(os.environ.get(SITE_ENV) or Path(basedir or ".") / DEFAULT_SITE)


def gpu_model(basedir: str | Path | None = None) -> str | None:
    """The GPU model that GPU jobs ask for (the site file's `gpu_model`), or None."""
    path = Path(site_path(basedir))
    model = read_site(path).get("gpu_model") if path.is_file() else None
    return str(model) if model else None


def default_account() -> str | None:
    """The user's default account in SLURM's database, or None where there is none."""
    if shutil.which("sacctmgr") is None:
        return None
    command = ["sacctmgr", "--noheader", "--parsable2", "show", "user", getpass.getuser()]
    result = run_command([*command, "format=DefaultAccount"])
    lines = result.stdout.split() if result.returncode == 0 else []
    return lines[0] if lines else None


def named_partitions(config: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """(dotted key, partition) of every `slurm_partition` the config sets."""
    if isinstance(config, dict):
        for name, value in config.items():
            dotted = f"{key}.{name}" if key else str(name)
            if name == "slurm_partition" and value:
                yield dotted, str(value)
            else:
                yield from named_partitions(value, dotted)


def read_site(site_file: str | Path) -> dict[str, Any]:
    """The site file's values (profiles/slurm/site.yaml or GPUFLOW_SLURM_SITE)."""
    try:
        stat = os.stat(site_file)
        return copy.deepcopy(_parsed_site(str(site_file), stat.st_mtime_ns, stat.st_size))
    except FileNotFoundError:
        raise DataError(
            site_file,
            "no SLURM site file here",
            expected=f"the workflow's folder as the current one, or the file named in ${SITE_ENV}",
        ) from None


@cache
def _parsed_site(site_file: str, mtime_ns: int, size: int) -> dict[str, Any]:
    """The site file parsed once per version of it (a plan reads it for every rule)."""
    with open(site_file, encoding="utf-8") as handle:
        return safe_yaml(handle) or {}


def charges(site: dict[str, Any]) -> dict[str, float]:
    """Allocation units a GPU-hour costs on each partition (the site's `charges`)."""
    return {str(name): float(units) for name, units in (site.get("charges") or {}).items()}


def interconnect(site: dict[str, Any]) -> dict[str, float]:
    """The site's all-reduce bandwidths in GB/s of NCCL bus bandwidth ({} where none)."""
    stated = site.get("interconnect") or {}
    return {str(key): float(value) for key, value in stated.items() if value}


def stop_warning_minutes(site: dict[str, Any]) -> float:
    """How long before a job's time limit the site warns it (`stop_warning_minutes`; 0: never)."""
    return float(site.get("stop_warning_minutes") or 0)


def warning_signal(site: dict[str, Any]) -> str | None:
    """sbatch's option for the site's stop warning (SIGUSR1), or None."""
    minutes = stop_warning_minutes(site)
    return f"--signal=USR1@{round(minutes * 60)}" if minutes else None


def slurm_extra(site: dict[str, Any]) -> str | None:
    """The profile's `slurm_extra` for every job (stop warning, reservation, mail), or None."""
    parts = [warning_signal(site)]
    for key, option in SBATCH_EXTRA.items():
        if site.get(key):
            parts.append(f"{option}={shlex.quote(str(site[key]))}")
    return " ".join(part for part in parts if part) or None


def check_partitions(config: dict[str, Any], site_file: str | Path) -> None:
    """Raise ConfigError when the config names a partition the site file does not have."""
    site = read_site(site_file)
    known = sorted(site.get("partitions") or {})
    for key, partition in named_partitions(config):
        if partition not in known:
            raise ConfigError(
                key,
                f"partition '{partition}' is not in the site file {site_file}",
                f"one of {known}",
            )
