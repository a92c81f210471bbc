"""Resume states outlive the job that wrote its outputs, until Snakemake has accepted them."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from gpuflow.job.atomic import write_json

RECORDS_ENV = "GPUFLOW_FINISHED_STATES"
RECORDS_FOLDER = ".snakemake/gpuflow/finished-states"


def records_folder(workdir: str | Path) -> Path:
    """Where the workflow run in `workdir` records its jobs' kept states."""
    return Path(workdir).resolve() / RECORDS_FOLDER


def release(files: Iterable[str | Path], outputs: Iterable[str | Path]) -> None:
    """The outputs are written: drop the resume `files` now, or once the workflow accepts them."""
    files = [Path(f).resolve() for f in files]
    folder = os.environ.get(RECORDS_ENV)
    if not folder:
        for path in files:
            path.unlink(missing_ok=True)
        return
    key = hashlib.sha256(str(files[0]).encode()).hexdigest()[:32]
    write_json(
        Path(folder) / f"{key}.json",
        {"files": [str(f) for f in files], "outputs": [str(Path(o).resolve()) for o in outputs]},
    )


def clean(folder: str | Path) -> list[Path]:
    """Remove the kept states whose outputs all exist; returns the files removed."""
    removed: list[Path] = []
    for record_path in sorted(Path(folder).glob("*.json")):
        try:
            record = json.loads(record_path.read_text())
            files = [Path(f) for f in record["files"]]
            outputs = [Path(o) for o in record["outputs"]]
        except (OSError, ValueError, KeyError, TypeError):
            record_path.unlink(missing_ok=True)  # not a record of ours: nothing to act on
            continue
        if not any(path.exists() for path in files):
            record_path.unlink(missing_ok=True)  # a later run of the job used them up
            continue
        if all(output.exists() for output in outputs):
            for path in files:
                if path.exists():
                    path.unlink()
                    removed.append(path)
            record_path.unlink(missing_ok=True)
    return removed


def clean_main(args: argparse.Namespace) -> None:
    """`gpuflow clean-states`: remove the kept resume states of jobs whose outputs exist."""
    for path in clean(records_folder(args.directory)):
        print(f"removed {path}")
