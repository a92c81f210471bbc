"""The job's own settings (config `telemetry`) reach a step one way, as every setting does.

- they travel as the `telemetry` part of the step's `--settings` (results keys) and `--runtime`
  (runtime keys) JSON, on every step; the job context holds them, defaulted from the schema;
- the step reads only its family's keys: the `telemetry` part is taken off first;
- a key in the wrong half is refused with its dotted name, as a family's key is;
- a report flags jobs below the threshold its own settings give, and the workflow passes every
  job the configured sampling interval (tests/test_settings_workflow.py, `interval_s == 0.5`).
"""

from __future__ import annotations

import argparse
import json
import re

import pytest
import yaml

from gpuflow.cli import main as gpuflow_main
from gpuflow.errors import ConfigError
from gpuflow.job import Job, current
from gpuflow.job.record import record_path
from gpuflow.job.record_tables import section
from gpuflow.job.telemetry.settings import take_job_settings
from gpuflow.settings.blocks import family_settings, split_json
from gpuflow.settings.validate import merge_config, schema_families
from tests.conftest import REPO, snakemake


def test_the_telemetry_part_goes_to_the_job_and_the_step_reads_only_its_familys_keys():
    args = argparse.Namespace(
        settings=json.dumps({"perplexity": {"stride": 8}, "telemetry": {}}),
        runtime=json.dumps({"cpu_workers": 2, "telemetry": {"interval_s": 0.5}}),
    )
    job_settings = take_job_settings(args)
    assert job_settings == {
        "interval_s": 0.5,
        "low_utilisation_percent": 50,
        "tracker": "none",
        "tracker_folder": "results/tracking",
    }
    assert json.loads(args.runtime) == {"cpu_workers": 2}
    assert json.loads(args.settings) == {"perplexity": {"stride": 8}}
    fluency = family_settings("fluency", args.settings, args.runtime)
    assert "telemetry" not in fluency and fluency["cpu_workers"] == 2


def test_without_a_telemetry_part_the_job_takes_the_schemas_defaults():
    args = argparse.Namespace(settings="{}", runtime="not json")
    defaults = {
        "interval_s": 5,
        "low_utilisation_percent": 50,
        "tracker": "none",
        "tracker_folder": "results/tracking",
    }
    assert take_job_settings(args) == defaults
    assert args.runtime == "not json"  # left for the step, which names the error
    assert current().settings == defaults


def test_a_job_key_in_the_wrong_half_is_refused_by_its_dotted_name():
    args = argparse.Namespace(runtime=json.dumps({"telemetry": {"low_utilisation_percent": 5}}))
    with pytest.raises(ConfigError, match=r"telemetry\.low_utilisation_percent.*not a runtime"):
        take_job_settings(args)


def test_a_rules_json_carries_the_job_part_of_its_own_kind_only():
    telemetry = {"interval_s": 2, "low_utilisation_percent": 30}
    runtime = json.loads(split_json("sweep", {"cpu_workers": 1}, "runtime", telemetry))
    assert runtime == {"cpu_workers": 1, "telemetry": {"interval_s": 2}}
    results = json.loads(split_json("scaling", {"efficiency_target": 0.6}, "results", telemetry))
    assert results == {"efficiency_target": 0.6, "telemetry": {"low_utilisation_percent": 30}}


def test_every_step_takes_the_job_settings_and_samples_at_the_given_interval(tmp_path, capsys):
    out = tmp_path / "probe.json"
    runtime = json.dumps({"telemetry": {"interval_s": 0.07}})
    assert gpuflow_main(["probe", "--out", str(out), "--hold", "0", "--runtime", runtime]) == 0
    assert json.loads(record_path(out).read_text())["interval_s"] == 0.07
    wrong = json.dumps({"telemetry": {"interval_s": 0.01}})  # below the schema's minimum
    assert gpuflow_main(["probe", "--out", str(out), "--runtime", wrong]) == 2
    assert "telemetry.interval_s" in capsys.readouterr().err


def test_a_report_flags_jobs_below_the_threshold_of_its_own_settings(tmp_path):
    family = tmp_path / "results" / "probe"
    idle = family / "idle.json"
    runtime = json.dumps({"telemetry": {"interval_s": 0.1}})
    assert gpuflow_main(["probe", "--out", str(idle), "--hold", "0.5", "--runtime", runtime]) == 0
    report = family / "summary.md"
    for threshold, flagged in ((100, True), (0, False)):
        settings = {"interval_s": 5, "low_utilisation_percent": threshold}
        with Job("report", [report], settings):
            text = section(report)
        assert "| idle.json | finished |" in text
        assert ("LOW:" in text) is flagged, (threshold, text)


def test_every_gpuflow_step_of_the_workflow_gets_the_jobs_settings(tmp_path):
    paper = yaml.safe_load((REPO / "config" / "paper.yaml").read_text(encoding="utf-8"))
    config = merge_config(paper, {"telemetry": {"interval_s": 2, "low_utilisation_percent": 30}})
    config["families"] = schema_families()
    result = snakemake(tmp_path, config, "-n", "-p")
    commands = [line for line in result.stdout.splitlines() if "gpuflow " in line]
    steps = {
        re.search(r"gpuflow (?:with-gpus -- .*?-m gpuflow )?([a-z-]+)", c)[1] for c in commands
    }
    assert {"ssvae-fetch", "ssvae-report", "perplexity", "scaling-train", "sweep-shard"} <= steps
    for command in commands:
        assert '"telemetry":{"interval_s":2,"tracker":"none"}' in command, command
        report = re.search(r"gpuflow (fluency|ssvae|scaling)-report ", command)
        assert ('"telemetry":{"low_utilisation_percent":30}' in command) == bool(report), command
