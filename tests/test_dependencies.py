"""What gpuflow needs is declared, once, with the floors it was tested at.

- every package a module of src/ imports is a dependency in pyproject.toml (an undeclared one
  installs only by luck: as a dependency of a dependency, until that one drops it);
- uv.lock, which `make install` installs from, still answers pyproject.toml (`make lock`
  rewrites it after a dependency changed);
- envs/gpuflow.yaml, the conda environment, declares the same packages with the same ranges,
  and those of the extras a job may use (`tracking`).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from tests.conftest import BIN

REPO = Path(__file__).resolve().parents[1]
OWN = {"gpuflow", "snakemake_executor_plugin_gpuflow_slurm"}  # src/'s own top-level packages
CONDA_NAMES = {"pytorch": "torch"}  # conda-forge's name -> PyPI's, where they differ
CONDA_ONLY = {"python", "cuda-version", "pip"}  # the environment's own, not gpuflow's
JOB_EXTRAS = ("tracking",)  # extras the workflow's jobs use: the conda environment holds them
CONDA_LINE = re.compile(r"([A-Za-z0-9_.\-]+)(?:\[([^\]]*)\])?(.*)")  # name, [keys], range


def canonical(name: str) -> str:
    """PyPI's normalised form of a project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(extras: tuple[str, ...] = ()) -> dict[str, SpecifierSet]:
    """pyproject.toml's dependencies and those of `extras`: canonical name -> range."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lines = [*project["dependencies"]]
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    requirements = [Requirement(line) for line in lines]
    return {canonical(r.name): r.specifier for r in requirements}


def imported_roots(source: str) -> set[str]:
    """Top-level names of every absolute import in `source`, wherever it stands (in a function,
    under `if TYPE_CHECKING`, in a try)."""
    roots = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_every_package_a_module_imports_is_declared_in_pyproject():
    providers = metadata.packages_distributions()
    wanted = declared()
    undeclared = []
    for path in sorted((REPO / "src").rglob("*.py")):
        for root in sorted(imported_roots(path.read_text(encoding="utf-8"))):
            if root in sys.stdlib_module_names or root in OWN:
                continue
            names = {canonical(name) for name in providers.get(root, [])}
            if not names & wanted.keys():
                found = ", ".join(sorted(names)) or "no installed distribution"
                undeclared.append(f"{path.relative_to(REPO)} imports {root} ({found})")
    assert not undeclared, "declare them in pyproject.toml's dependencies:\n" + "\n".join(
        undeclared
    )


def test_uv_lock_answers_pyproject():
    """`uv lock --check` resolves nothing new when the lock still answers pyproject.toml, and
    needs no network for it (0.4 s here)."""
    result = subprocess.run(
        [str(BIN / "uv"), "lock", "--check", "--offline"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"uv.lock is out of date: run `make lock`\n{result.stderr}"


def conda_requirements() -> dict[str, str]:
    """envs/gpuflow.yaml's packages, conda's and pip's: PyPI name -> range as written."""
    environment = yaml.safe_load((REPO / "envs" / "gpuflow.yaml").read_text(encoding="utf-8"))
    found = {}
    for entry in environment["dependencies"]:
        lines = entry["pip"] if isinstance(entry, dict) else [entry]
        for line in lines:
            if line.startswith("--"):  # --editable=.. (gpuflow itself)
                continue
            name, bracket, rest = CONDA_LINE.match(line).groups()
            if bracket:  # pytorch[version='>=2.11',build='cuda*']
                rest = re.search(r"version='([^']*)'", bracket).group(1)
            name = CONDA_NAMES.get(name, name)
            if name not in CONDA_ONLY:
                found[canonical(name)] = rest.strip()
    return found


def test_the_conda_environment_declares_pyprojects_packages_and_ranges():
    conda = conda_requirements()
    wanted = declared(JOB_EXTRAS)
    assert sorted(conda) == sorted(wanted), "the same packages in both"
    differ = {n: (str(wanted[n]), conda[n]) for n in wanted if SpecifierSet(conda[n]) != wanted[n]}
    assert not differ, f"pyproject.toml's range against envs/gpuflow.yaml's: {differ}"
