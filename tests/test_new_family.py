"""Adding a family, proven: docs/adding-a-family.md followed step by step, and nothing else.

A copy of the workflow gets a toy fifth family (`toy`: a seeded Monte Carlo estimate of pi, 12
units of real work in the job's resumable loop; its files in tests/toy_family/), one function
per checklist step. The copy's own `gpuflow` package runs (PYTHONPATH=<copy>/src, ahead of the
editable install's path: the `gpuflow` command, `python -m gpuflow`, Snakemake and the shell
commands of its rules all import it). Each step's effect is checked once it is taken, in the
checklist's order, so a step left out fails the test naming it. Then the family is planned, run,
run again with its step killed mid-loop (SIGKILL), seen failed by `gpuflow status`, resumed to
the bytes the uninterrupted run wrote, and seen done.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuflow.job.outputlock import read_holder
from gpuflow.job.paths import STATE, job_file
from gpuflow.ops.status.collect import KILLED
from tests.conftest import BIN, REPO, wait_for_file, workflow_env

pytestmark = pytest.mark.workflow

CHECKLIST = REPO / "docs" / "adding-a-family.md"
TOY = REPO / "tests" / "toy_family"
# What a user's checkout of the workflow holds (no .venv, results, .snakemake or .git).
WORKFLOW_PARTS = ("Snakefile", "workflow", "src", "config", "profiles", "envs", "benchmarks")
SCHEMAS = Path("src/gpuflow/settings/schemas")
RULE, OUT = "toy_estimate", Path("results/toy/estimate.csv")
UNITS = 12  # tests/toy_family/config-block.yaml
TOY_ONLY = "toy-only.yaml"


def copy_workflow(folder: Path) -> Path:
    """The workflow's parts copied into `folder` (compiled bytecode kept: same mtimes), and a
    config file of the tests' that enables the toy family alone."""
    for part in WORKFLOW_PARTS:
        source = REPO / part
        if source.is_dir():
            ignored = shutil.ignore_patterns("*.egg-info")
            shutil.copytree(source, folder / part, symlinks=True, ignore=ignored)
        else:
            shutil.copy2(source, folder / part)
    (folder / TOY_ONLY).write_text("families: [toy]\n", encoding="utf-8")
    return folder


def copy_env(copy: Path) -> dict[str, str]:
    """The environment rules run in (conftest.workflow_env), with the copy's `gpuflow` package
    ahead of the installed one on Python's path."""
    return {**workflow_env(), "PYTHONPATH": str(copy / "src")}


def in_copy(
    copy: Path, *command: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run this venv's `command[0]` in the copy with the copy's `gpuflow` package."""
    result = subprocess.run(
        [str(BIN / command[0]), *command[1:]],
        cwd=copy,
        env=copy_env(copy),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"`{' '.join(command)}` failed ({result.returncode}):\n"
            f"{result.stdout[-1500:]}\n{result.stderr[-2500:]}"
        )
    return result


def edit(path: Path, old: str, new: str) -> None:
    """Replace the one place `old` stands in `path` by `new`."""
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{path}: expected {old!r} once"
    path.write_text(text.replace(old, new), encoding="utf-8")


def append(path: Path, template: str) -> None:
    """Add tests/toy_family/`template` at the end of `path`."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write((TOY / template).read_text(encoding="utf-8"))


def add_to_list(path: Path, before: str) -> None:
    """Add `toy` to the one YAML flow list in `path` that follows the regex `before`."""
    text, found = re.subn(f"({before}[^\\]]*)\\]", r"\1, toy]", path.read_text(encoding="utf-8"))
    assert found == 1, f"{path}: expected one list after {before!r}"
    path.write_text(text, encoding="utf-8")


def plan_rows(copy: Path) -> dict[str, dict[str, Any]]:
    """`gpuflow plan --json` of the copy's default target (`all`) with the toy family alone
    (the copy's config.yaml merged under toy-only.yaml, as Snakemake merges config files), by
    rule."""
    rows = json.loads(in_copy(copy, "gpuflow", "plan", "--json", "--configfile", TOY_ONLY).stdout)
    return {row["rule"]: row for row in rows}


def status(copy: Path) -> dict[str, Any]:
    """`gpuflow status --json` of the toy rule's job in the copy."""
    return json.loads(in_copy(copy, "gpuflow", "status", "--json", RULE).stdout)


# --- the checklist's steps, each taken as docs/adding-a-family.md says (in parts: the edits
# it names), then checked ------------------------------------------------------------------

PACKAGE = Path("src/gpuflow/toy")


def schema_file(copy: Path) -> None:
    shutil.copy(TOY / "toy.schema.yaml", copy / SCHEMAS)


def schema_ref(copy: Path) -> None:
    toy = "\n  toy:\n    $ref: toy.schema.yaml\n    default: {}"
    edit(copy / SCHEMAS / "config.schema.yaml", "\n  telemetry:\n", f"{toy}\n  telemetry:\n")


def families_enum(copy: Path) -> None:
    add_to_list(copy / SCHEMAS / "config.schema.yaml", r"\n      enum: \[")


def read_config(copy: Path, *files: str) -> dict[str, Any]:
    """The copy's config from `files`, validated and defaulted by its own schema."""
    probe = (
        "import json, sys; from gpuflow.settings.validate import load_config;"
        " print(json.dumps(load_config(*sys.argv[1:])))"
    )
    return json.loads(in_copy(copy, "python", "-c", probe, *files).stdout)


def schema_is_read(copy: Path) -> None:
    config = read_config(copy, TOY_ONLY)
    assert "toy" in config, "config.schema.yaml: no toy under properties"
    assert (config["toy"]["units"], config["toy"]["resources"][RULE]["mem_mb"]) == (100, 1000)


def config_families(copy: Path) -> None:
    add_to_list(copy / "config/config.yaml", r"\nfamilies: \[")


def config_block(copy: Path) -> None:
    append(copy / "config/config.yaml", "config-block.yaml")


def config_names_it(copy: Path) -> None:
    config = read_config(copy, "config/config.yaml")
    assert "toy" in config["families"], f"config/config.yaml: families {config['families']}"
    assert config["toy"]["units"] == UNITS, f"config/config.yaml: no toy block {config['toy']}"


def doc_marker(copy: Path) -> None:
    append(copy / "config/README.template.md", "readme-section.md")


def doc_written(copy: Path) -> None:
    in_copy(copy, "gpuflow", "config-doc")


def config_doc_lists_it(copy: Path) -> None:
    readme = (copy / "config/README.md").read_text(encoding="utf-8")
    assert "| `toy.units` | integer |" in readme, "config/README.md lists no toy keys"


def package_init(copy: Path) -> None:
    (copy / PACKAGE).mkdir(exist_ok=True)
    (copy / PACKAGE / "__init__.py").write_text('"""The toy family."""\n', encoding="utf-8")


def steps_module(copy: Path) -> None:
    (copy / PACKAGE).mkdir(exist_ok=True)
    shutil.copy(TOY / "steps.py", copy / PACKAGE)


def step_is_registered(copy: Path) -> None:
    # `python -m gpuflow`, as the `gpuflow` command and the rules' shell commands, finds it
    helped = in_copy(copy, "python", "-m", "gpuflow", "toy-estimate", "--help").stdout
    assert "--settings" in helped and "--out" in helped, helped


def step_module(copy: Path) -> None:
    (copy / PACKAGE).mkdir(exist_ok=True)
    shutil.copy(TOY / "estimate.py", copy / PACKAGE)


def step_is_there(copy: Path) -> None:
    # what it does, the run shows
    in_copy(copy, "python", "-c", "from gpuflow.toy.estimate import main")


def rules_helpers(copy: Path) -> None:
    shutil.copy(TOY / "toy_helpers.smk", copy / "workflow/rules")


def rules_file(copy: Path) -> None:
    shutil.copy(TOY / "toy.smk", copy / "workflow/rules")


def snakefile_include(copy: Path) -> None:
    last = 'include: "workflow/rules/sweep.smk"\n'
    edit(copy / "Snakefile", last, f'{last}include: "workflow/rules/toy.smk"\n')


def plan_takes_it(copy: Path) -> None:
    """`gpuflow plan` of the default target plans the toy job (and the run's timeline)."""
    rows = plan_rows(copy)
    assert sorted(rows) == sorted([RULE, "timeline"]), f"expected {RULE} in the plan: {rows}"
    assert (rows[RULE]["jobs"], rows[RULE]["why"]) == (1, {"missing": 1}), rows[RULE]
    assert rows[RULE]["source"] == "r", "no work model: planned at its runtime limit"


Part = tuple[str, Callable[[Path], None]]  # what the checklist's step says, and that edit


@dataclass(frozen=True)
class Step:
    """A numbered step of docs/adding-a-family.md: its bold name, what shows it was taken (an
    error where it was not) and its parts."""

    name: str
    check: Callable[[Path], None]
    parts: tuple[Part, ...]


STEPS = (
    Step("Schema", schema_is_read, (
        ("src/gpuflow/settings/schemas/<family>.schema.yaml", schema_file),
        ("$ref: <family>.schema.yaml", schema_ref),
        ("its name in the `families` enum", families_enum),
    )),
    Step("Config", config_names_it, (
        ("the name in `families`", config_families),
        ("the family's block", config_block),
    )),
    Step("Config doc", config_doc_lists_it, (
        ("<!-- keys: <family> -->", doc_marker),
        ("gpuflow config-doc", doc_written),
    )),
    Step("Registration", step_is_registered, (
        ("src/gpuflow/<family>/__init__.py", package_init),
        ("src/gpuflow/<family>/steps.py", steps_module),
    )),
    Step("Step", step_is_there, (("src/gpuflow/<family>/<module>.py", step_module),)),
    Step("Rules", plan_takes_it, (
        ("workflow/rules/<family>_helpers.smk", rules_helpers),
        ("workflow/rules/<family>.smk", rules_file),
        ('include: "workflow/rules/<family>.smk"', snakefile_include),
    )),
)  # fmt: skip


class StepMissing(AssertionError):
    """A checklist step not taken, or not whole."""


def follow_checklist(copy: Path, leave_out: str | None = None) -> None:
    """Take the steps in the checklist's order, each checked once taken; a step whose part or
    check fails fails the test, naming it. `leave_out`: a step or a part (its function's name)
    not taken; the steps before it go unchecked (their checks would see what they see in the
    whole checklist)."""
    checked = leave_out is None
    for number, step in enumerate(STEPS, 1):
        parts = [edit for _, edit in step.parts if leave_out not in (step.name, edit.__name__)]
        checked = checked or len(parts) < len(step.parts)
        try:
            for part in parts:
                part(copy)
            if checked:
                step.check(copy)
        except Exception as error:
            raise StepMissing(
                f"checklist step {number} **{step.name}.** (docs/adding-a-family.md) is missing"
                f" or incomplete: {type(error).__name__}: {error}"
            ) from None


def checklist_steps() -> dict[str, str]:
    """The numbered steps of docs/adding-a-family.md: each one's text (whitespace made single
    spaces) by its bold name."""
    text = CHECKLIST.read_text(encoding="utf-8")
    steps = re.findall(r"^\d+\. \*\*(.+?)\.\*\*(.*?)(?=^\S|\Z)", text, re.MULTILINE | re.DOTALL)
    return {name: " ".join(says.split()) for name, says in steps}


def test_the_checklist_lists_exactly_the_steps_the_toy_family_takes():
    steps = checklist_steps()
    assert list(steps) == [step.name for step in STEPS]
    for step in STEPS:
        for says, _ in step.parts:
            assert says in steps[step.name], f"checklist step {step.name}: no {says!r}"


# --- the toy family, built by the checklist: planned, run, killed, resumed, seen -------------


def test_a_family_added_by_the_checklist_plans_runs_resumes_and_shows(tmp_path):
    copy = copy_workflow(tmp_path)
    follow_checklist(copy)
    # planned by `gpuflow plan` (plan_takes_it); run uninterrupted
    in_copy(copy, "snakemake", "--cores", "1", RULE)
    uninterrupted = (copy / OUT).read_bytes()
    assert len(uninterrupted.decode().splitlines()) == 1 + UNITS
    assert "resumed from" not in (copy / "results/toy/logs/estimate.log").read_text()
    # again, its step killed mid-loop once its first unit is saved (SIGKILL, the out-of-memory
    # killer's: no time to save anything more)
    state = job_file(copy / OUT, STATE)
    assert not state.exists(), "the finished run dropped its state"
    command = [str(BIN / "snakemake"), RULE, "--cores", "1", "--forcerun", RULE]
    run = subprocess.Popen(
        command, cwd=copy, env=copy_env(copy), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_file(state, run, 60)
        os.kill(int((read_holder(copy / OUT) or {})["pid"]), signal.SIGKILL)
        assert run.wait(timeout=60) != 0
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    killed = status(copy)
    [row] = killed["rules"]
    assert (row["family"], row["rule"], row["failed"]) == ("toy", RULE, 1), row
    assert killed["failed"][0]["last_line"] == KILLED
    # resumed where the state was saved, to the same bytes
    in_copy(copy, "snakemake", "--cores", "1", RULE)
    log = (copy / "results/toy/logs/estimate.log").read_text(encoding="utf-8")
    resumed = re.search(r"resumed from \S+ after unit (\d+)", log)
    assert resumed and 1 <= int(resumed[1]) < UNITS, log
    assert (copy / OUT).read_bytes() == uninterrupted
    [row] = status(copy)["rules"]
    assert (row["family"], row["rule"], row["done"], row["jobs"]) == ("toy", RULE, 1, 1), row


PARTS = [(step.name, edit.__name__) for step in STEPS for _, edit in step.parts]


@pytest.mark.parametrize(("step", "left_out"), [(s.name, s.name) for s in STEPS] + PARTS)
def test_a_step_or_part_left_out_fails_the_toy_family_naming_the_step(tmp_path, step, left_out):
    copy = copy_workflow(tmp_path)
    with pytest.raises(StepMissing) as failed:
        follow_checklist(copy, leave_out=left_out)
    assert f"**{step}.**" in str(failed.value)
