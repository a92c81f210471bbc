"""`runtime: auto` on the live cluster: a limit derived from a prediction that is too short.

The SSVAE training asks for `runtime: auto` with the site's stop warning 30 s before the limit,
and the records hold a rate a thousand times too fast for its work: its prediction is nearly
nothing, so its limit is the floor: the warning, the minute by which SLURM may send it early
and one epoch, rounded up to 2 minutes. SLURM warns it (SIGUSR1) 60 to 90 s after its start
(slurmctld checks limits every 30 s), long after its step started. Its 100 epochs of at least
1.2 s each cannot fit: it saves the epoch it is in and stops; the profile retries it with
twice the limit, it resumes there and finishes with the metrics of an unhurried local run.
`gpuflow ledger` then counts both attempts from sacct.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuflow.cost.models import planned_work
from gpuflow.cost.records import RECORDS_ENV, rate_field
from gpuflow.job.paths import RECORD, job_file
from gpuflow.settings.validate import load_config
from gpuflow.slurm.site import SITE_ENV
from tests.conftest import gpuflow, snakemake, tiny_config, wait_for
from tests.slurm import grid_faults, harness

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]
pytest_plugins = ["tests.slurm.fixtures"]

POINT = {"frac": "0.2", "corrupt": "0.0", "alpha": "10"}
SSVAE = "results/ssvae/frac~0.2/corrupt~0.0/alpha~10/seed~0/metrics.json"
LOG = "results/ssvae/logs/train/frac~0.2/corrupt~0.0/alpha~10.log"
EPOCHS = 100  # of at least 1.2 s each (the epoch floor): more than the 90 s before the warning


def auto_config() -> dict[str, Any]:
    config = tiny_config("slurm")
    config["families"] = ["ssvae"]
    config["ssvae"]["data"] = {"test_fraction": 0.8}
    config["ssvae"]["train"].update(epochs=EPOCHS, eval_frequency=25)
    config["ssvae"]["resources"]["ssvae_train"]["runtime"] = "auto"
    return config


def too_fast_records(folder: Path, config: dict[str, Any]) -> Path:
    """A rates record of the test cluster's GPU (testgpu) with the training's FLOP rate a
    thousand times what this machine does: the job is predicted to take milliseconds."""
    configfile = folder / "config.yaml"
    configfile.write_text(yaml.safe_dump(config))
    work = planned_work("ssvae_train", load_config(configfile), POINT)
    [train, *_] = [term for term in work.terms if term.kind == "ssvae.m2.flop"]
    row = {
        "path": "a rate far too fast",
        "rate": rate_field(train.kind, train.shape, "FLOP/s", [1e14]),
    }
    records = folder / "records"
    records.mkdir()
    record = {"created": "2026-11-27T00:00:00+00:00", "device_class": "testgpu", "rows": [row]}
    (records / "2026-11-27-testgpu-rates.json").write_text(json.dumps(record))
    return records


def warning_site(folder: Path) -> Path:
    """The test cluster's site file with a stop warning 30 s before the limit and auto limits
    of the prediction alone (no margin, no start-up allowance)."""
    site = yaml.safe_load((harness.REPO / "tests" / "slurm" / "site.yaml").read_text())
    site.update(stop_warning_minutes=0.5, auto_runtime={"margin": 1, "startup_minutes": 0})
    path = folder / "site.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


def accounted_training(name: str) -> list[dict[str, str]]:
    """sacct's record of each attempt of the training, once it has the last one ended (the
    run read the states from sacct; slurmdbd may store an end a moment later)."""
    fields = "JobIDRaw,State,Timelimit,ElapsedRaw,Comment"
    found: list[dict[str, str]] = []

    def ended() -> bool:
        rows = [
            dict(zip(fields.split(","), row, strict=True))
            for row in harness.sacct_jobs(name, fields)
        ]
        found[:] = [row for row in rows if row["Comment"].startswith("rule_ssvae_train")]
        return bool(found) and found[-1]["State"] == "COMPLETED"

    wait_for(ended, "sacct's record of the training", 60)
    return found


@pytest.fixture(scope="module")
def run(slurm_cluster, tmp_path_factory) -> dict[str, Any]:
    """The run on the cluster and, at the same time, the same config run locally, unhurried."""
    config = auto_config()
    setup = tmp_path_factory.mktemp("auto-setup")
    local, cluster = (tmp_path_factory.mktemp(name) for name in ("auto-local", "auto-cluster"))
    env = grid_faults.install(setup / "bin", {"ssvae-train": "epoch-floor:1.2"})
    env.update(
        {RECORDS_ENV: str(too_fast_records(setup, config)), SITE_ENV: str(warning_site(setup))}
    )
    attempts: list[str] = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        unhurried = pool.submit(snakemake, local, config, SSVAE)
        result, _ = harness.run_profile(
            cluster, harness.REPO / "Snakefile", config, SSVAE, "--retries", "3",
            watchers=[lambda stop: harness.follow_log(cluster / LOG, attempts, stop)],
            env=env, timeout=900,
        )  # fmt: skip
        unhurried.result()
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-8000:]}"
    jobs = accounted_training(harness.run_id(result.stderr))
    ledger = gpuflow(
        "ledger", "--json", "--profile", str(harness.REPO / "profiles" / "slurm"),
        "--profile", str(harness.TEST_PROFILE), "--snakefile", str(harness.REPO / "Snakefile"),
        "--directory", str(cluster), SSVAE, "--configfile", str(cluster / "test-config.yaml"),
        env=env,
    )  # fmt: skip
    attempts = [text for text in attempts if text.strip()]
    return {"local": local, "cluster": cluster, "jobs": jobs, "attempts": attempts,
            "ledger": {row["rule"]: row for row in json.loads(ledger.stdout)}}  # fmt: skip


def test_the_auto_limit_is_the_floor_then_doubles_on_the_retry(run):
    limits = [job["Timelimit"] for job in run["jobs"]]
    assert limits[:2] == ["00:02:00", "00:04:00"], run["jobs"]
    assert run["jobs"][0]["State"] == "FAILED", "stopped by the step itself, warned in time"


def test_the_training_is_warned_saves_and_the_retry_resumes_where_it_stopped(run):
    first, *later = run["attempts"]
    stopped = re.findall(r"stopped by SIGUSR1 after epoch (\d+) of", first)
    assert len(stopped) == 1, first[-2000:]
    resumed = re.findall(r"resumed from \S+ after epoch (\d+)", later[0])
    assert resumed == stopped, later[0][-2000:]
    epochs = [
        int(e)
        for text in run["attempts"]
        for e in re.findall(rf"^epoch (\d+)/{EPOCHS}", text, re.M)
    ]
    assert epochs == list(range(1, EPOCHS + 1)), "each epoch once, in order"


def test_the_resumed_training_equals_the_unhurried_run(run):
    def comparable(path: Path) -> dict[str, Any]:
        metrics = json.loads(path.read_text())
        return {k: v for k, v in metrics.items() if k not in ("timing", "run_record")}

    assert comparable(run["cluster"] / SSVAE) == comparable(run["local"] / SSVAE)


def test_the_ledger_counts_both_attempts_from_sacct_and_the_resumed_work_from_the_record(run):
    row = run["ledger"]["ssvae_train"]
    elapsed = sum(int(job["ElapsedRaw"]) for job in run["jobs"])
    assert len(run["jobs"]) >= 2 and row["slurm_gpu_h"] == pytest.approx(elapsed / 3600)
    assert row["billing_h"] > 0
    record = json.loads(job_file(run["cluster"] / SSVAE, RECORD).read_text())
    spent = record["wall_s"] + record["timings"]["earlier_attempts_s"]
    assert record["timings"]["earlier_attempts_s"] > 0 and row["spent_s"] == pytest.approx(spent)
    assert row["sources"] == "w", "planned from the (too fast) rate"
