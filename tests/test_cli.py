"""Every step is a `gpuflow <step>` command; the command line itself stays light."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from gpuflow.settings.validate import schema_families
from tests.conftest import REPO


def test_the_step_list_loads_without_importing_torch_pandas_or_numpy():
    probe = (
        "import sys; from gpuflow.cli import build_parser; build_parser(); "
        "print([m for m in ('torch', 'pandas', 'transformers', 'numpy') if m in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr


def registered_steps() -> dict[str, object]:
    """Each step's `run` entry point, by step name."""
    from gpuflow.cli import build_parser

    parser = build_parser()
    (steps,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: sub.get_default("run") for name, sub in steps.choices.items()}


def test_every_registered_step_imports_its_entry_point():
    from gpuflow.registry import LazyStep

    entry_points = registered_steps()
    assert len(entry_points) > 20
    for name, entry_point in entry_points.items():
        assert isinstance(entry_point, LazyStep), name
        assert callable(entry_point.load()), f"{name}: {entry_point.target}"


# Steps that only read tables and write tables, figures or reports: each job of theirs is a
# process of its own, and importing torch would cost it seconds of CPU for nothing.
TABLE_STEPS = (
    "fluency-texts", "fluency-merge", "fluency-stats", "fluency-figures", "fluency-report",
    "ssvae-aggregate", "ssvae-figures", "ssvae-report", "scaling-data", "scaling-summary",
    "scaling-figures", "scaling-report", "sweep-aggregate", "sweep-figures", "report-tables",
    "timeline",
)  # fmt: skip


def test_steps_that_only_read_tables_do_not_import_torch():
    probe = (
        "import sys; from tests.test_cli import registered_steps, TABLE_STEPS; "
        "steps = registered_steps(); [steps[name].load() for name in TABLE_STEPS]; "
        "print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO)
    assert result.stdout.strip() == "False", result.stderr[-2000:]


def test_the_step_modules_do_not_import_the_cli():
    modules = ["ops", "job", *schema_families()]
    probe = (
        f"import sys, {', '.join(f'gpuflow.{name}.steps' for name in modules)};"
        " print('gpuflow.cli' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


def test_every_fluency_step_is_registered(run_gpuflow):
    listing = run_gpuflow("--help").stdout
    for step in (
        "doctor",
        "fluency-texts",
        "fluency-train-lm",
        "perplexity",
        "toxicity",
        "fluency-merge",
        "fluency-stats",
        "fluency-figures",
        "fluency-report",
    ):
        assert step in listing


def test_doctor_reports_machine_and_config_usage(run_gpuflow):
    report = json.loads(
        run_gpuflow("doctor", "--json", "--configfile", str(REPO / "config" / "config.yaml")).stdout
    )
    machine = report["machine"]
    assert machine["distributed_backends"]["gloo"] is True
    assert machine["cpu_matmul_ok"] is True
    assert machine["versions"]["torch"]
    assert all(path for path in machine["embedded_data"].values())
    assert "fluency_perplexity" in report["config"]["fluency"]["rules"]


def test_doctor_names_a_bad_config_key(tmp_path, run_gpuflow):
    bad = tmp_path / "bad.yaml"
    bad.write_text("families: [fluency]\nfluency: {cpu_workers: 0}\n")
    result = run_gpuflow("doctor", "--configfile", str(bad), check=False)
    assert result.returncode == 2
    assert "config key 'fluency.cpu_workers'" in result.stderr
