"""Wheels of everything gpuflow needs but torch, for a GPU machine that cannot reach a registry.

Compute nodes often have no internet while the login node has; their Python (a module, a conda
environment, a container image) already holds a CUDA build of torch. Run this where pip reaches
the registry, with gpuflow installed (`make wheelhouse`): it pins every package gpuflow needs,
directly or through another package, to the version installed here (the tested set), stops at
torch (the node's own build stays), and downloads each as a wheel for the node's Python. Then,
on the node, in a checkout of this repository:

    make install PYTHON=python3 WHEELHOUSE=wheelhouse    # or make gpu-check / make run ...

which makes .venv with the node's Python, lets it see that Python's packages (its torch) through
a .pth file, and installs from the folder alone (`pip --no-index`). `--skip` leaves out packages
the node already has.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
# The node's own build stays: torch (with its CUDA libraries) is never taken from here.
NODE_OWN = {"torch"}
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]


def canonical(name: str) -> str:
    """PyPI's normalised form of a project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _applies(requirement: Requirement, python_version: str) -> bool:
    """Whether a requirement holds on the node (its markers read for the node's Python)."""
    if requirement.marker is None:
        return True
    environment = {"python_version": python_version, "python_full_version": f"{python_version}.0"}
    return requirement.marker.evaluate({**environment, "extra": ""})


def pins(python_version: str, skip: set[str]) -> dict[str, str]:
    """name -> installed version of every package gpuflow needs (no extras), torch left out."""
    found: dict[str, str] = {}
    todo = [Requirement(r) for r in metadata.requires("gpuflow") or []]
    while todo:
        requirement = todo.pop()
        name = canonical(requirement.name)
        if name in found or name in NODE_OWN or not _applies(requirement, python_version):
            continue
        try:
            distribution = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            raise SystemExit(
                f"wheelhouse: {requirement} is needed but not installed here "
                "(expected gpuflow installed in this environment: make install)"
            ) from None
        found[name] = distribution.version
        todo.extend(Requirement(r) for r in distribution.requires or [])
    return {name: version for name, version in sorted(found.items()) if name not in skip}


def build_requirements() -> list[str]:
    """What building gpuflow from its checkout needs (pyproject's build-system.requires)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(project["build-system"]["requires"])


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def fetch(spec: str, dest: Path, python_version: str) -> None:
    """One wheel of `spec` for the node; a project with no such wheel is built here if pure."""
    target = ["--python-version", python_version, "--implementation", "cp"]
    for platform in PLATFORMS:
        target += ["--platform", platform]
    download = _pip("download", "--no-deps", "--only-binary=:all:", *target, "-d", str(dest), spec)
    if download.returncode == 0:
        return
    before = set(dest.iterdir())
    built = _pip("wheel", "--no-deps", "-w", str(dest), spec)
    new = set(dest.iterdir()) - before
    if built.returncode != 0 or not all(p.name.endswith("-none-any.whl") for p in new):
        for path in new:
            path.unlink()
        last = (download.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise SystemExit(
            f"wheelhouse: no wheel of {spec} for CPython {python_version} on x86-64 Linux: {last}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=ROOT / "wheelhouse")
    parser.add_argument(
        "--python-version", default="3.11", help="the node's Python, e.g. 3.12 (default 3.11)"
    )
    parser.add_argument(
        "--skip", nargs="*", default=[], help="packages the node already has (left out)"
    )
    args = parser.parse_args(argv)
    args.dest.mkdir(parents=True, exist_ok=True)
    wanted = pins(args.python_version, {canonical(name) for name in args.skip})
    specs = [f"{name}=={version}" for name, version in wanted.items()] + build_requirements()
    for number, spec in enumerate(specs, 1):
        print(f"wheelhouse: [{number}/{len(specs)}] {spec}", flush=True)
        fetch(spec, args.dest, args.python_version)
    size = sum(path.stat().st_size for path in args.dest.iterdir()) / 2**20
    print(
        f"wheelhouse: {len(specs)} wheels for CPython {args.python_version} in {args.dest}, "
        f"{size:.0f} MiB; torch is the node's own"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
