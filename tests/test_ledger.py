"""Calibrated plans and the ledger on real runs: `gpuflow calibrate` measures every rate a
config's jobs need, so `gpuflow plan` predicts them (`w`); `gpuflow ledger` sets what a run
spent, from its job records, beside what was planned."""

from __future__ import annotations

import argparse
import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from gpuflow.cost.predict import Prediction
from gpuflow.fluency import work as fluency_work
from gpuflow.job.paths import RECORD, job_file
from gpuflow.ops.calibrate import measure, needs
from gpuflow.ops.ledger import Line
from gpuflow.slurm.queue import Allocation
from gpuflow.work import STARTUP, Need, Term
from tests.conftest import BIN, REPO, config_file, tiny_config, workflow_env
from tests.test_plan import SNAKEFILE, write_probe_config

pytestmark = pytest.mark.workflow


def rows_of(run_gpuflow, step: str, *args: str) -> dict[str, dict]:
    return {row["rule"]: row for row in json.loads(run_gpuflow(step, "--json", *args).stdout)}


def test_a_calibration_measures_every_rate_the_config_s_jobs_need(run_gpuflow, tmp_path):
    workdir, records = tmp_path / "run", tmp_path / "records"
    config = workdir / "config.yaml"
    workdir.mkdir()
    config.write_text(json.dumps(tiny_config("sweep")))
    options = ["--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)]
    before = rows_of(
        run_gpuflow, "plan", *options, "--timings", str(records), "--configfile", str(config)
    )
    assert before["sweep_shard"]["source"] == "r", "nothing measured yet"
    done = run_gpuflow("calibrate", *options, "--out", str(records), "--configfile", str(config))
    [written] = records.glob("*-rates.json")
    kinds = {
        (row["rate"]["kind"], row["rate"]["shape"])
        for row in json.loads(written.read_text())["rows"]
    }
    assert {kind for kind, _ in kinds} == {"startup", "sweep.gd.seed", "sweep.gnc.seed"}, (
        done.stdout
    )
    assert all(len(row["rate"]["trials"]) == 3 for row in json.loads(written.read_text())["rows"])
    after = rows_of(
        run_gpuflow, "plan", *options, "--timings", str(records), "--configfile", str(config)
    )
    shard = after["sweep_shard"]
    assert shard["source"] == "w" and shard["basis"] == [written.name]
    low, high = shard["range_h_per_job"]
    assert (
        low <= shard["expected_h_per_job"] <= high
        and high < before["sweep_shard"]["expected_h_per_job"]
    )


def planned_needs(workdir: Path, config: dict) -> list[Need]:
    """What `gpuflow calibrate` would measure for `config`'s jobs planned in `workdir`."""
    workdir.mkdir()
    configfile = workdir / "config.yaml"
    configfile.write_text(json.dumps(config))
    args = argparse.Namespace(
        directory=str(workdir), profile=[], snakefile=str(REPO / "Snakefile"),
        configfile=[str(configfile)], targets=[],
    )  # fmt: skip
    return needs(args)


def test_on_a_gpu_node_each_rate_goes_to_the_record_of_the_device_whose_jobs_need_it(tmp_path):
    """The plan reads a job's rates from its device's record: a GPU node's CPU-only jobs (the
    toxicity scorer, the baselines) from the node's CPU record. Host rates (start-ups, state
    writes) are measured once and go to every device whose jobs need them. A GPU job's host
    rates are measured on the CPU, so this runs here: the sweep's jobs plus start-ups and state
    writes of GPU jobs, one shared with the CPU jobs."""
    workdir = tmp_path / "run"
    found = planned_needs(workdir, tiny_config("sweep"))
    cpu_startup = next(need for need in found if need.term.kind == STARTUP)
    gpu_only = Need(
        Term(STARTUP, 1, "gpuflow.job.gpulock"), "probe_gpu", {}, {}, 1, "cuda", workdir
    )
    on_gpu = [
        replace(cpu_startup, device="cuda"),
        gpu_only,
        replace(gpu_only, term=Term("state.write", 1)),
    ]
    rows, skipped = measure([*found, *on_gpu], trials=1)
    kinds = {
        device: {(row["rate"]["kind"], row["rate"]["shape"]) for row in found_rows}
        for device, found_rows in rows.items()
    }
    assert not skipped
    assert kinds["cuda"] == {
        (STARTUP, cpu_startup.term.shape), (STARTUP, "gpuflow.job.gpulock"), ("state.write", ""),
    }  # fmt: skip
    assert kinds["cpu"] == {(need.term.kind, need.term.shape) for need in found}
    shared = [
        row["rate"]["trials"]
        for device in ("cpu", "cuda")
        for row in rows[device]
        if row["rate"]["shape"] == cpu_startup.term.shape
    ]
    assert shared[0] == shared[1] and len(shared[0]) == 1, "one start-up measured, filed twice"


def test_a_slow_training_step_is_timed_once_per_trial_a_quick_one_twice(tmp_path, monkeypatch):
    """GPT-2-large's training step takes 30 s on a CPU: on the H100 node the pilot's calibration
    spent about 210 of its 393 s on seven of them. Its warm-up step says how slow a step is."""
    config = {**tiny_config("all"), "families": ["fluency"]}
    [need] = [n for n in planned_needs(tmp_path / "run", config) if n.term.kind == "lm.train.flop"]
    assert fluency_work.train_trial(need).what.startswith("2 training steps of")
    monkeypatch.setattr(fluency_work, "SLOW_STEP_S", 0.0)
    slow = fluency_work.train_trial(need)
    assert slow.what.startswith("1 training step of")
    assert slow.run() > 0


def test_the_ledger_s_gpu_hours_are_the_job_records_wall_times_gpus(run_gpuflow, tmp_path):
    workdir = tmp_path / "run"
    config = write_probe_config(workdir, n_gpu_jobs=3)
    targets = [f"results/probe/gpu~{i}.json" for i in range(3)]
    options = [
        "--snakefile",
        str(SNAKEFILE),
        "--directory",
        str(workdir),
        "--configfile",
        str(config),
    ]
    subprocess.run(
        [str(BIN / "snakemake"), *targets, *options, "--cores", "2", "--quiet"],
        env=workflow_env(), check=True, capture_output=True,
    )  # fmt: skip
    records = [json.loads(job_file(workdir / t, RECORD).read_text()) for t in targets]
    wall = sum(record["wall_s"] for record in records)
    row = rows_of(run_gpuflow, "ledger", *targets, *options)["probe_gpu"]
    assert (row["jobs"], row["ended"]) == (3, 3)
    assert row["spent_s"] == pytest.approx(wall)
    assert row["spent_gpu_h"] == pytest.approx(1 * wall / 3600), "1 GPU each"
    assert row["planned_gpu_h"] == pytest.approx(3 * 0.5), "planned at the 30-minute limit (r)"
    assert row["sources"] == "r" and row["slurm_gpu_h"] == 0, "no SLURM here"
    table = run_gpuflow("ledger", *targets, *options).stdout
    assert table.splitlines()[2].split()[:2] == ["probe_gpu", "3/3"]


def test_the_same_params_on_other_data_are_scaled_from_the_folder_s_benchmark(
    run_gpuflow, finished_all, tmp_path
):
    """The session's finished run trained its SSVAE jobs on 4,000 digits; the same jobs on 2,000
    (test_fraction 0.6: their data job's params change, their own do not) are planned at their
    benchmarks scaled by the steps of an epoch, not at the benchmarks as they are."""
    config = tiny_config("all")
    options = ["--snakefile", str(REPO / "Snakefile"), "--directory", str(finished_all)]
    options += ["--timings", str(tmp_path / "none")]
    benchmarks = sorted((finished_all / "results/ssvae/benchmarks/train").rglob("*.tsv"))
    seconds = [float(b.read_text().splitlines()[1].split("\t")[0]) for b in benchmarks]
    halved = tmp_path / "halved.yaml"
    config["ssvae"]["data"] = {"test_fraction": 0.6}
    halved.write_text(json.dumps(config))
    train = rows_of(run_gpuflow, "plan", *options, "--configfile", str(halved))["ssvae_train"]
    assert len(seconds) == 2, "one job per label fraction, its seeds stacked"
    assert train["source"] == "b" and train["why"] == {"downstream": 2}
    batch = config["ssvae"]["train"]["batch_size"]
    for fraction in config["ssvae"]["grid"]["fractions"]:  # unlabelled // batch: 7, then 3
        assert [(n - round(fraction * n)) // batch for n in (4000, 2000)] == [7, 3]
    mean = sum(seconds) / len(seconds)
    assert train["expected_h_per_job"] * 3600 == pytest.approx(mean * 3 / 7)
    same = config_file(tmp_path, tiny_config("all"))  # not in the run: others dry-run it
    again = rows_of(run_gpuflow, "plan", *options, "--configfile", str(same))
    assert "ssvae_train" not in again, "the same data: nothing to run"


def test_a_ledger_line_counts_each_job_s_gpus_and_charges_each_allocation_per_gpu_hour():
    """A 4-GPU job planned at an hour spent half an hour by its record; SLURM held two attempts
    of it on gpu_h100 (192 units a GPU-hour), 30 and 15 minutes of 4 GPUs, each at sacct's
    billing weight of 8; a second job, not yet started, is planned at its limit."""
    line = Line("train")
    attempts = [
        Allocation("1", "rule_train", "gpu_h100", 1800, 4, 8.0),
        Allocation("2", "rule_train", "gpu_h100", 900, 4, 8.0),
    ]
    line.add(4, Prediction(3600, 3600, 3600, "w"), (1800.0, True), attempts, {"gpu_h100": 192})
    line.add(4, Prediction(3600, 3600, 3600, "r"), (0.0, False), [], {"gpu_h100": 192})
    assert (line.jobs, line.ended, line.sources) == (2, 1, {"w", "r"})
    assert line.planned_gpu_h == pytest.approx(2 * 4 * 1.0)
    assert line.spent_gpu_h == pytest.approx(4 * 0.5)
    assert line.slurm_gpu_h == pytest.approx(4 * 0.75)
    assert line.billing_h == pytest.approx(8 * 0.75)
    assert line.units == pytest.approx(192 * 4 * 0.75)
