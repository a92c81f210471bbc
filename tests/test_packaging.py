"""A plain `pip install .` (no editable install, no repository beside it) carries its schemas:
config-doc answers and a settings load is validated against the packaged schema."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gpuflow built as a wheel from a copy of this checkout's files (no build folder or
    egg-info of an earlier install to borrow from) and installed into a folder of its own."""
    base = tmp_path_factory.mktemp("packaged")
    source, wheels, target = base / "source", base / "wheels", base / "site"
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    for name in listed:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
        check=True,
        cwd=base,
    )
    (wheel,) = wheels.glob("gpuflow-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "gpuflow/settings/schemas/config.schema.yaml" in names
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True)
    return target


def run_outside(installed: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`python *args` from an empty folder, with the installed copy of gpuflow first on the path."""
    env = {**os.environ, "PYTHONPATH": str(installed)}
    return subprocess.run(
        [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True
    )


def test_the_installed_package_is_not_the_checkout(installed, tmp_path):
    found = run_outside(installed, tmp_path, "-c", "import gpuflow; print(gpuflow.__file__)")
    assert found.stdout.startswith(str(installed)), found.stdout + found.stderr


def test_config_doc_answers_outside_the_repository(installed, tmp_path):
    answer = run_outside(installed, tmp_path, "-m", "gpuflow", "config-doc", "--help")
    assert answer.returncode == 0, answer.stderr
    assert "config/README.md" in answer.stdout


def test_a_settings_load_is_validated_by_the_packaged_schema(installed, tmp_path):
    code = (
        "from gpuflow.settings.blocks import family_settings\n"
        "s = family_settings('ssvae', '{}', '{}')\n"
        "print(s['train']['epochs'])\n"
        "family_settings('ssvae', '{\"train\": {\"epochs\": -1}}', '{}')\n"
    )
    answer = run_outside(installed, tmp_path, "-c", code)
    assert answer.stdout.strip().isdigit(), answer.stdout + answer.stderr
    assert "ssvae.train.epochs" in answer.stderr and "minimum" in answer.stderr
