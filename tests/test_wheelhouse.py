"""`make wheelhouse`: what a GPU node with no registry gets, and how it installs from it."""

import importlib.util
import subprocess
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("wheelhouse", ROOT / "scripts" / "wheelhouse.py")
wheelhouse = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wheelhouse)


def runtime_requirements() -> set[str]:
    return {
        wheelhouse.canonical(Requirement(r).name)
        for r in metadata.requires("gpuflow")
        if "extra ==" not in r
    }


def test_every_runtime_need_is_pinned_to_the_tested_version_and_torch_is_the_nodes_own():
    pins = wheelhouse.pins("3.11", set())
    assert runtime_requirements() - {"torch"} <= set(pins)
    # needed only through other packages: snakemake's, jsonschema's
    assert {"snakemake-interface-common", "referencing", "rpds-py"} <= set(pins)
    assert all(pins[name] == metadata.version(name) for name in pins)
    assert "torch" not in pins
    assert "sympy" not in pins  # torch's own need, reached through torch alone


def test_dev_tools_stay_out_and_skipped_packages_are_left_to_the_node():
    pins = wheelhouse.pins("3.11", {"numpy", "scipy"})
    assert not {"pytest", "pytest-xdist", "ruff", "snakefmt"} & set(pins)
    assert not {"numpy", "scipy"} & set(pins)
    assert "pandas" in pins


def test_the_build_backend_travels_so_the_checkout_installs_offline():
    assert wheelhouse.build_requirements() == ["setuptools>=68"]


def test_with_a_wheelhouse_make_installs_on_the_nodes_python_from_that_folder_alone(tmp_path):
    printed = subprocess.run(
        ["make", "-n", "-B", "install", "WHEELHOUSE=/nodes/wheels", f"VENV={tmp_path}/venv"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "-m venv --clear" in printed  # never a venv left by another interpreter
    assert "node-python.pth" in printed and "site.getsitepackages()" in printed  # its torch
    # without resolving: on an H100 node pip did not count the torch seen through that file
    assert "pip install --quiet --no-index --no-deps /nodes/wheels/*.whl" in printed
    assert "pip install --quiet --no-index --no-deps --no-build-isolation -e ." in printed
    assert "import gpuflow.cli, snakemake, torch, transformers" in printed  # none missing
    assert "[dev]" not in printed and "torch==" not in printed
