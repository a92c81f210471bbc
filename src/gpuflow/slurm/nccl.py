"""The site's NCCL settings: the `nccl:` block of the SLURM site file (profiles/slurm/site.yaml)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

from gpuflow.errors import DataError
from gpuflow.slurm.site import read_site, site_path

NCCL_NAME = re.compile(r"^NCCL_[A-Z0-9_]+$")
EXPECTED = "NCCL_* names (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, NCCL_DEBUG, ...) with text or numbers"


def site_nccl(site: dict[str, Any], site_file: str | Path) -> dict[str, str]:
    """The `nccl` block of a site file's values, each value as text; {} where there is none."""
    block = site.get("nccl")
    if block is None:
        return {}
    if not isinstance(block, dict):
        raise DataError(site_file, f"nccl: {block!r} is not a block of settings", expected=EXPECTED)
    settings = {}
    for name, value in block.items():
        if not isinstance(name, str) or not NCCL_NAME.match(name):
            raise DataError(site_file, f"nccl: {name!r} is not an NCCL variable", expected=EXPECTED)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise DataError(
                site_file,
                f"nccl.{name}: {value!r} is not text or a number",
                expected="text, or a number (0 or 1 for off and on: NCCL reads no true/false)",
            )
        settings[name] = str(value)
    return settings


def nccl_json(basedir: str | Path | None = None) -> str:
    """The site's NCCL settings as one shell-quoted JSON argument (`--nccl`)."""
    path = Path(site_path(basedir))
    settings = site_nccl(read_site(path), path) if path.is_file() else {}
    return shlex.quote(json.dumps(settings, sort_keys=True, separators=(",", ":")))
