"""The timeline of a run: job records keep every attempt, and `gpuflow timeline` draws each one
as a bar on the lane of the GPU (or CPU slot) it used, marked where it failed, was stopped by a
signal, was requeued or never recorded its end.

The records here are written by the real job code (gpuflow.job.record.job_record) under the
environment SLURM gives a job; NVML is a stand-in where a test needs a GPU it can name.
"""

from __future__ import annotations

import json
import socket
from contextlib import suppress
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import pynvml
import pytest

from gpuflow.job.paths import RECORD, STATE, job_file
from gpuflow.job.record import job_record
from gpuflow.job.record_attempts import NO_END
from gpuflow.job.stopping import Stopped
from gpuflow.ops.timeline import (
    FAILED,
    REQUEUED,
    STOPPED,
    STYLES,
    UNENDED,
    figure,
    read_records,
    rule_namer,
    timeline_bars,
)
from tests.test_telemetry import OneGpuNvml

HOST = socket.gethostname()
TRAIN = "results/ssvae/frac~0.1/seed~0/metrics.json"
SHARD = "results/sweep/shards/shard~0.csv"
RULES = {"ssvae_train": [r"results/ssvae/frac~(?P<f>[^/]+)/seed~(?P<s>\d+)/metrics\.json$"]}


@pytest.fixture
def no_nvml(monkeypatch):
    """A machine without a GPU driver: NVML does not start (as on this CPU machine)."""

    def fail() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", fail)


@pytest.fixture
def workdir(tmp_path, monkeypatch, no_nvml) -> Path:
    """A run folder as the working directory, with nothing of a SLURM job in the environment."""
    monkeypatch.chdir(tmp_path)
    for name in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "SLURMD_NODENAME", "GPUFLOW_GPUS"):
        monkeypatch.delenv(name, raising=False)
    for output in (TRAIN, SHARD):
        Path(output).parent.mkdir(parents=True)
    return tmp_path


def run_attempt(
    monkeypatch: pytest.MonkeyPatch,
    output: str,
    outcome: str = "finished",
    gpus: str = "",
    slurm_job: str | None = None,
    restart: int | None = None,
    node: str | None = None,
) -> None:
    """One attempt of the job writing `output`, through the real job record, on GPUs `gpus`
    (CUDA_VISIBLE_DEVICES) in SLURM job `slurm_job` on `node` (SLURM_RESTART_COUNT `restart`,
    or none in the step's environment): it finishes, fails, is stopped by a signal, or is
    killed (its record left as it was at its start)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpus)
    for name, value in [
        ("SLURM_JOB_ID", slurm_job),
        ("SLURM_RESTART_COUNT", restart),
        ("SLURMD_NODENAME", node),
    ]:
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, str(value))
    record = job_file(output, RECORD)
    with suppress(Stopped, ValueError), job_record("ssvae-train", [Path(output)], 60.0):
        at_start = record.read_text()
        if outcome == "stopped":
            raise Stopped("stopped by SIGTERM")
        if outcome == "failed":
            raise ValueError("diverged")
    if outcome == "killed":
        record.write_text(at_start)


def record_of(output: str) -> dict[str, Any]:
    return json.loads(job_file(output, RECORD).read_text())


def bars_of(workdir: Path, now: float = 0.0) -> list[Any]:
    return timeline_bars(read_records(workdir / "results"), rule_namer(RULES), now)


def test_each_attempt_is_one_bar_on_the_lane_of_the_gpu_its_record_names(workdir, monkeypatch):
    run_attempt(monkeypatch, TRAIN, "stopped", gpus="2", slurm_job="70")
    run_attempt(monkeypatch, TRAIN, "finished", gpus="0,3", slurm_job="71")
    run_attempt(monkeypatch, SHARD, "finished", gpus="")
    attempts = record_of(TRAIN)["attempts"]
    assert [[g["device"] for g in a["gpus"]] for a in attempts] == [["2"], ["0", "3"]]
    bars = bars_of(workdir)
    train = [(bar.attempt, bar.lane, bar.rule) for bar in bars if bar.job == TRAIN]
    assert sorted(train) == [
        (1, f"{HOST} GPU 2", "ssvae_train"),
        (2, f"{HOST} GPU 0", "ssvae_train"),
        (2, f"{HOST} GPU 3", "ssvae_train"),
    ]
    [shard] = [bar for bar in bars if bar.job == SHARD]
    assert (shard.lane, shard.rule) == (f"{HOST} CPU slot 1", "sweep: ssvae-train")
    first = next(bar for bar in bars if bar.job == TRAIN)
    assert (first.start, first.end) == (attempts[0]["started"], attempts[0]["ended"])


def test_a_gpu_nvml_names_gets_the_lane_of_its_uuid(workdir, monkeypatch):
    nvml = OneGpuNvml()
    for name in dir(nvml):
        if name.startswith("nvml"):
            monkeypatch.setattr(pynvml, name, getattr(nvml, name))
    run_attempt(monkeypatch, TRAIN, gpus="0")
    [attempt] = record_of(TRAIN)["attempts"]
    assert attempt["gpus"] == [{"device": "0", "uuid": "GPU-0000"}]
    assert [bar.lane for bar in bars_of(workdir)] == [f"{HOST} GPU-0000"]


def test_failed_stopped_requeued_and_killed_attempts_are_kept_and_marked(workdir, monkeypatch):
    """SLURM job 80 is stopped (SIGTERM) and requeued in place; its restart, whose step does not
    see SLURM_RESTART_COUNT (as under Snakemake's job-step executor), fails; Snakemake's retry
    (job 81) is killed without a word; the next retry (job 82, on node gpn2) finishes."""
    run_attempt(monkeypatch, TRAIN, "stopped", gpus="1", slurm_job="80", restart=0)
    run_attempt(monkeypatch, TRAIN, "failed", gpus="1", slurm_job="80")
    run_attempt(monkeypatch, TRAIN, "killed", gpus="2", slurm_job="81")
    run_attempt(monkeypatch, TRAIN, "finished", gpus="2", slurm_job="82", node="gpn2")
    record = record_of(TRAIN)
    attempts = record["attempts"]
    assert [(a["slurm_job_id"], a["restart"], a["status"]) for a in attempts] == [
        ("80", 0, "stopped"),
        ("80", 1, "failed (ValueError)"),
        ("81", 0, NO_END),
        ("82", 0, "finished"),
    ]
    assert (record["slurm_job_id"], record["status"]) == ("82", "finished"), "the last attempt's"
    bars = bars_of(workdir)
    lanes = [f"{HOST} GPU 1", f"{HOST} GPU 1", f"{HOST} GPU 2", "gpn2 GPU 2"]
    assert [bar.lane for bar in bars] == lanes
    assert [bar.marks for bar in bars] == [(STOPPED, REQUEUED), (FAILED,), (UNENDED,), ()]
    assert bars[2].end == attempts[3]["started"], "a killed attempt lasts until the next starts"
    drawn = figure(bars).axes[0]
    patches = [p for p in drawn.patches if p.get_height() > 0]
    assert [p.get_hatch() for p in patches] == ["///", "xx", None, None]
    assert patches[2].get_linestyle() == ":"
    legend = [text.get_text() for text in drawn.get_legend().get_texts()]
    marks = [STYLES[mark][1] for mark in (FAILED, STOPPED, UNENDED)]
    assert legend[:1] == ["ssvae_train"] and set(marks) < set(legend)
    assert any("requeued" in label for label in legend)
    plt.close("all")


def test_a_finished_job_run_again_starts_a_new_list_unless_it_kept_its_state(workdir, monkeypatch):
    """A finished job that runs again (its outputs made anew) is not another attempt; one that
    still keeps its resume state (SLURM ended it after its step finished) is."""
    run_attempt(monkeypatch, TRAIN)
    run_attempt(monkeypatch, TRAIN)
    assert len(record_of(TRAIN)["attempts"]) == 1
    job_file(TRAIN, STATE).write_bytes(b"kept")
    run_attempt(monkeypatch, TRAIN)
    assert len(record_of(TRAIN)["attempts"]) == 2


def test_a_record_of_an_older_gpuflow_is_one_attempt(workdir):
    record = job_file(TRAIN, RECORD)
    record.parent.mkdir(parents=True)
    older = {"step": "ssvae-train", "outputs": [TRAIN], "host": "node7", "slurm_job_id": "9",
             "started": 100.0, "ended": 160.0, "status": "stopped"}  # fmt: skip
    record.write_text(json.dumps(older))
    [bar] = bars_of(workdir)
    assert (bar.lane, bar.start, bar.end, bar.marks) == (
        "node7 CPU slot 1",
        100.0,
        160.0,
        (STOPPED,),
    )


def test_cpu_slots_are_shared_out_so_bars_on_one_lane_never_overlap():
    def record(output: str, start: float, end: float) -> dict[str, Any]:
        attempt = {"started": start, "ended": end, "status": "finished", "host": "n1", "gpus": []}
        return {"outputs": [output], "step": "sweep-shard", "attempts": [attempt]}

    spans = {"a": (0, 10), "b": (2, 5), "c": (5, 12), "d": (6, 7), "e": (10, 11)}
    records = [record(f"results/sweep/{name}", *span) for name, span in spans.items()]
    bars = timeline_bars(records, rule_namer({}), now=0.0)
    lanes = {bar.job.rsplit("/", 1)[1]: bar.lane for bar in bars}
    assert lanes == {"a": "n1 CPU slot 1", "b": "n1 CPU slot 2", "c": "n1 CPU slot 2",
                     "d": "n1 CPU slot 3", "e": "n1 CPU slot 1"}  # fmt: skip


def test_the_step_writes_the_figure_and_a_row_per_bar(workdir, monkeypatch, run_gpuflow):
    run_attempt(monkeypatch, TRAIN, "stopped", gpus="1", slurm_job="90")
    run_attempt(monkeypatch, TRAIN, "finished", gpus="1", slurm_job="90", restart=1)
    out, table = workdir / "results/timeline/timeline.png", workdir / "results/timeline/bars.csv"
    rules = json.dumps(RULES)
    result = run_gpuflow(
        "timeline", "--results", str(workdir / "results"), "--rules", rules,
        "--out", str(out), "--out-table", str(table),
    )  # fmt: skip
    assert "2 bars (1 jobs) on 1 lanes" in result.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = pd.read_csv(table, keep_default_na=False)
    assert list(rows["rule"]) == ["ssvae_train"] * 2
    assert list(rows["marks"]) == ["stopped;requeued", ""]
    assert (rows["lane"] == f"{HOST} GPU 1").all()
    again = run_gpuflow(
        "timeline", "--results", str(workdir / "results"), "--out", str(out),
        "--out-table", str(table),
    )  # fmt: skip
    assert "2 bars (1 jobs)" in again.stdout, "the timeline's own record is not drawn"
