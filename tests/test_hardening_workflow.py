"""Faults over the whole workflow, and the report as a person sees it.

One tiny run of all four families is the reference. A copy of it re-runs the jobs that hold
state (perplexity, SSVAE training, DDP training, sweep shards and everything after them) while a
driver SIGKILLs them at chosen moments, seen by polling their logs and state files: a job's
process during model load, jobs mid-epoch, the whole Snakemake process tree mid-epoch and while
an output is being written. The run's `gpuflow` is tests/slurm/grid_faults.py, which makes every
seed of the sweep shards last at least SEED_FLOOR_S: their seeds take milliseconds, and the kill
after a shard's first seed would otherwise land after its last one on a busy machine (seen once,
"3 already done"), and every SSVAE epoch last at least EPOCH_FLOOR_S, for the same reason.
After every kill each output is absent or complete; re-running the same command finishes the
workflow, and its numbers equal the reference's.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from gpuflow.job.paths import RECORD, job_file
from gpuflow.settings.validate import schema_families
from tests.conftest import (
    BIN,
    REPO,
    config_file,
    holds_now,
    snakemake,
    tiny_config,
    wait_while_running,
    workflow_env,
)
from tests.slurm import grid_faults
from tests.test_scaling_ddp import assert_same_weights
from tests.test_ssvae_train import comparable

pytestmark = pytest.mark.workflow

TINY_ALL = tiny_config("all")

# Outputs of the jobs that keep state, and everything after them: the faulted copy deletes
# them, so those jobs run again (of the DDP runs, the 2-process one the faults need).
RERUN_OUTPUTS = [
    "results/fluency/perplexity/shard~0.csv",
    "results/ssvae/frac~0.1/corrupt~0.5/alpha~1/seed~0/metrics.json",
    "results/scaling/runs/short/nodes~1/world~2/*",
    "results/sweep/shards/method~*/rank~2/width~4/shard~0.*",
    "results/fluency/[!lt]*.*",
    "results/ssvae/*.*",
    "results/scaling/*.*",
    "results/sweep/*.*",
    "results/*/figures/*",
    "results/fluency/stats/*",
]


@pytest.fixture(scope="module")
def reference(finished_all: Path) -> Path:
    """An undisturbed run of every family (the session's shared run: copy it before changing it)."""
    return finished_all


# --- what a complete output looks like -------------------------------------------------------


def complete(path: Path, expected: Path | None = None) -> bool:
    """Whether a file that looks finished (not hidden) reads back whole.

    Tables and texts must end with a newline; a table must have as many lines as the same
    table of the reference run (its rows are runs or texts, so a file cut mid-row loses a line
    or its last newline). Texts hold measured timings, so their length may differ.
    """
    suffix = path.suffix
    try:
        if suffix == ".png":
            data = path.read_bytes()
            return data.startswith(b"\x89PNG\r\n\x1a\n") and data.endswith(b"IEND\xaeB`\x82")
        if suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
        elif suffix in (".csv", ".tsv", ".md", ".txt", ".tex"):
            text = path.read_text(encoding="utf-8")
            if not text.strip() or not text.endswith("\n"):
                return False
            if suffix in (".csv", ".tsv"):
                pd.read_csv(path, sep="\t" if suffix == ".tsv" else ",")
                if expected is not None and expected.is_file():
                    rows = len(expected.read_text("utf-8").splitlines())
                    return len(text.splitlines()) == rows
        elif suffix == ".pt":
            torch.load(path, map_location="cpu", weights_only=True)
        elif suffix == ".npz":
            with np.load(path) as arrays:
                [arrays[key] for key in arrays.files]
        elif suffix == ".safetensors":
            from safetensors.torch import load_file

            load_file(path)
        elif suffix == ".jsonl":  # progress files: a torn last line is cut off by their reader
            return bool(path.read_text(encoding="utf-8").strip())
    except (OSError, ValueError, RuntimeError, pd.errors.ParserError, EOFError):
        return False
    return True


# Tables whose rows are job attempts: every kill adds rows, so the reference's count is no measure.
ROWS_PER_ATTEMPT = {Path("results/timeline/attempts.csv")}


def incomplete_outputs(workdir: Path, reference: Path) -> list[str]:
    """Outputs (and resume states) under results/ that do not read back whole, judged against
    the same files of the reference run."""
    return [
        str(path.relative_to(workdir))
        for path in (workdir / "results").rglob("*")
        if path.is_file() and "logs" not in path.parts and ".tmp-" not in path.name
        and not complete(path, expected_rows_from(path.relative_to(workdir), reference))
    ]  # fmt: skip


def expected_rows_from(relative: Path, reference: Path) -> Path | None:
    """The reference run's file whose row count `relative` must have (None: any count)."""
    return None if relative in ROWS_PER_ATTEMPT else reference / relative


# --- the fault driver ------------------------------------------------------------------------


@dataclass
class Fault:
    """Kill `target` (a step's command line, or None for the whole tree) once `ready` holds."""

    name: str
    ready: Callable[[Path], bool]
    target: str | None
    fired: bool = False


def group_processes(pgid: int, pattern: str) -> list[int]:
    """Processes of the process group whose command line holds `pattern`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ProcessLookupError):
            continue
        if pattern in cmdline and "/bin/sh" not in cmdline and "bash -c" not in cmdline:
            found.append(int(entry.name))
    return found


def kill_tree(root: int) -> None:
    """SIGKILL a process and all its descendants at once, as when the machine dies.

    torchrun starts its workers in sessions of their own, so killing the process group alone
    would leave them running.
    """
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start(workdir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Snakemake on TINY_ALL in a session of its own; `env` adds to the environment."""
    command = [
        str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--directory",
        str(workdir), "--configfile", str(config_file(workdir, TINY_ALL)), "--cores", "2", *args,
    ]  # fmt: skip
    log = open(workdir / f"driver-{time.monotonic_ns()}.log", "w")  # noqa: SIM115
    return subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**workflow_env(), **(env or {})},
        start_new_session=True,
    )


def run_with_faults(
    workdir: Path, faults: list[Fault], reference: Path, env: dict[str, str]
) -> list[str]:
    """Run to completion (`env` added to the environment), firing each fault once; return what
    happened, in order.

    After a single job is killed, Snakemake lets its other running jobs finish: faults that
    become ready meanwhile still fire in that run. Killing the whole tree ends the run.
    """
    events: list[str] = []
    for _attempt in range(12):
        process = start(workdir, env=env)
        fired: list[Fault] = []
        while process.poll() is None and not (fired and fired[-1].target is None):
            for fault in (f for f in faults if not f.fired):
                if not holds_now(partial(fault.ready, workdir)):
                    continue
                pids = (
                    [process.pid]
                    if fault.target is None
                    else group_processes(process.pid, fault.target)
                )
                if not pids:
                    continue
                if fault.target is None:
                    kill_tree(process.pid)
                else:
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
                fault.fired = True
                fired.append(fault)
                break
            time.sleep(0.01)
        status = process.wait(timeout=600)
        if not fired and status == 0:
            events.append("finished")
            return events
        events += [fault.name for fault in fired] or [f"exit {status}"]
        broken = incomplete_outputs(workdir, reference)
        assert not broken, f"after {events[-1]}: outputs that do not read back: {broken}"
        if fired and fired[-1].target is None:
            locked = snakemake(workdir, TINY_ALL, "--dry-run", check=False)
            assert "Directory cannot be locked" in locked.stdout + locked.stderr
            snakemake(workdir, TINY_ALL, "--unlock")
    raise AssertionError(f"the workflow did not finish: {events}")


def tmp_file_under(folder: str) -> Callable[[Path], bool]:
    def ready(workdir: Path) -> bool:
        root = workdir / folder
        return root.is_dir() and any(".tmp-" in p.name for p in root.iterdir())

    return ready


SSVAE_POINTS = [f"ssvae/frac~0.1/corrupt~0.5/alpha~1/seed~{seed}/metrics.json" for seed in (0, 1)]
SSVAE_STATE = "results/ssvae/jobs/frac~0.1/corrupt~0.5/alpha~1/seed~0/metrics.json.state.pt"
SCALING_RUN = "scaling/runs/short/nodes~1/world~2"
SCALING_STATE = "results/scaling/jobs/runs/short/nodes~1/world~2/run.json.state.pt"
SWEEP_STATE = "results/sweep/jobs/shards/method~gnc/rank~2/width~4/shard~0.csv.state.pt"
FLUENCY_LOG = "results/fluency/logs/perplexity/shard~0.log"
SEED_FLOOR_S = 1
EPOCH_FLOOR_S = 0.3  # the SSVAE kill lands before the last of its 6 epochs however busy


def faults() -> list[Fault]:
    return [
        Fault(
            "perplexity job killed while loading the model",
            lambda w: (w / FLUENCY_LOG).is_file() and not (w / FLUENCY_LOG).stat().st_size,
            "perplexity --texts",
        ),
        Fault(
            "SSVAE job killed mid-training (state after an epoch)",
            lambda w: (w / SSVAE_STATE).is_file(),
            "ssvae-train --model m2",
        ),
        Fault(
            "whole tree killed mid-epoch of a 2-process DDP run",
            lambda w: (w / SCALING_STATE).is_file(),
            None,
        ),
        Fault(
            "sweep shard killed after its first seed",
            lambda w: (w / SWEEP_STATE).is_file(),
            "sweep-shard --method gnc",
        ),
        Fault(
            "whole tree killed while a figure is being written",
            lambda w: any(
                tmp_file_under(f"results/{family}/figures")(w) for family in schema_families()
            ),
            None,
        ),
    ]


@pytest.fixture(scope="module")
def faulted(reference: Path, tmp_path_factory) -> tuple[Path, list[str]]:
    """A copy of the reference whose stateful jobs re-run under faults."""
    workdir = tmp_path_factory.mktemp("faulted") / "work"
    shutil.copytree(reference, workdir, symlinks=True)
    for stale in workdir.glob("driver-*.log"):
        stale.unlink()
    for pattern in RERUN_OUTPUTS:
        for path in filter(Path.is_file, workdir.glob(pattern)):
            path.unlink()
    floor = {
        "shard~0.csv": f"seed-floor:{SEED_FLOOR_S}",
        "ssvae-train": f"epoch-floor:{EPOCH_FLOOR_S}",
    }
    env = grid_faults.install(tmp_path_factory.mktemp("faulty-bin"), floor)
    events = run_with_faults(workdir, faults(), reference, env)
    return workdir, events


def test_every_fault_fired_and_the_rerun_finished(faulted, reference):
    workdir, events = faulted
    assert events[-1] == "finished", events
    for fault in faults():
        assert fault.name in events, (fault.name, events)
    assert not incomplete_outputs(workdir, reference)
    dry = snakemake(workdir, TINY_ALL, "--dry-run")
    assert "Nothing to be done" in dry.stdout + dry.stderr


# Fluency files the faulted re-run must leave as they were: of its perplexity shards only the
# deleted one (shard~0) runs again.
FLUENCY_KEPT = ["texts.csv", "lm", "shards", "toxicity", "perplexity/shard~1.*"]


def modification_times(workdir: Path, patterns: list[str]) -> dict[str, int]:
    """The mtime of every file matched by `patterns` (under results/fluency, folders whole)."""
    root = workdir / "results" / "fluency"
    paths = [p for pattern in patterns for p in root.glob(pattern)]
    files = [f for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()]
    return {str(f.relative_to(root)): f.stat().st_mtime_ns for f in files}


def test_a_killed_perplexity_shard_runs_again_alone(reference, faulted):
    """The texts, their shards, the LM, the toxicity scores and the other perplexity shard are
    the reference's files, untouched (the copy keeps their times); the killed shard is new."""
    workdir, events = faulted
    assert "perplexity job killed while loading the model" in events
    kept = modification_times(reference, FLUENCY_KEPT)
    assert "perplexity/shard~1.csv" in kept and "toxicity/shard~0.csv" in kept, sorted(kept)
    assert modification_times(workdir, FLUENCY_KEPT) == kept
    rerun = "results/fluency/perplexity/shard~0.csv"
    assert (workdir / rerun).stat().st_mtime_ns > (reference / rerun).stat().st_mtime_ns


def resumed_after(log: Path) -> int:
    """The epoch a training's last attempt resumed after, from its log's `resumed from` line;
    fails naming the log where it started over."""
    text = log.read_text()
    found = re.search(r"resumed from \S+ after epoch (\d+)\n", text)
    assert found, f"{log} started over:\n{text[-2000:]}"
    return int(found[1])


def test_killed_training_resumed_from_its_state_instead_of_starting_over(faulted):
    workdir, _ = faulted
    resumed = resumed_after(workdir / "results/ssvae/logs/train/frac~0.1/corrupt~0.5/alpha~1.log")
    for point in SSVAE_POINTS:  # both seeds of the stacked job, from the epoch its state held
        metrics = json.loads((workdir / "results" / point).read_text())
        assert metrics["timing"]["resumed_from_epoch"] == resumed >= 1
    resumed = resumed_after(workdir / "results/scaling/logs/train/short/nodes~1/world~2.log")
    run = json.loads((workdir / "results" / SCALING_RUN / "run.json").read_text())
    epoch = run["resumed_at_epochs"][-1]  # its last attempt resumed after its last saved epoch
    assert epoch == resumed >= 1 and run["epochs"][epoch]["after_resume"]
    assert [e["epoch"] for e in run["epochs"]] == list(range(1, len(run["epochs"]) + 1))
    # the shard's last run kept what earlier runs computed (a later whole-tree kill may have
    # stopped one of them after every seed but before its table: then all 3 are kept)
    sweep_log = (workdir / "results/sweep/logs/method~gnc/rank~2/width~4/shard~0.log").read_text()
    kept = re.findall(r"3 seeds, (\d) already done", sweep_log)
    assert kept and int(kept[0]) >= 1, sweep_log


RESUMED_OUTPUTS = {
    "ssvae": "results/ssvae/frac~0.1/corrupt~0.5/alpha~1/seed~0/metrics.json",
    "scaling": "results/scaling/runs/short/nodes~1/world~2/run.json",
    "sweep": "results/sweep/shards/method~gnc/rank~2/width~4/shard~0.csv",
}


def test_each_resumed_job_s_record_counts_the_work_its_killed_attempt_saved(faulted):
    """The resume state (SSVAE, scaling, sweep) carries the killed attempt's
    seconds to the attempt that finished, whose job record notes them (`gpuflow
    record-timings` adds them to its benchmark): at least one sweep seed of SEED_FLOOR_S."""
    workdir, _ = faulted
    for family, output in RESUMED_OUTPUTS.items():
        record = json.loads(job_file(workdir / output, RECORD).read_text())
        assert record["status"] == "finished", family
        assert record["timings"].get("earlier_attempts_s", 0) > 0, (family, record["timings"])
    sweep = json.loads(job_file(workdir / RESUMED_OUTPUTS["sweep"], RECORD).read_text())
    assert sweep["timings"]["earlier_attempts_s"] >= SEED_FLOOR_S


def test_no_temporary_files_or_resume_states_are_left_after_the_rerun(faulted):
    workdir, _ = faulted
    results = workdir / "results"
    assert not list(results.rglob(".*.tmp-*"))
    assert not list(results.rglob("*.state.pt"))


def frame(workdir: Path, name: str, columns: list[str], key: list[str]) -> pd.DataFrame:
    table = pd.read_csv(workdir / "results" / name)
    return table[key + columns].sort_values(key).reset_index(drop=True)


def test_results_after_faults_equal_the_undisturbed_run(reference, faulted):
    workdir, _ = faulted
    for name, key, columns in [
        ("fluency/scores.csv", ["text_id"], ["nll_sum", "n_tokens", "ppl", "toxicity"]),
        ("sweep/table.csv", ["method", "seed"], ["train_error", "test_error", "guesses"]),
    ]:
        pd.testing.assert_frame_equal(
            frame(reference, name, columns, key), frame(workdir, name, columns, key)
        )
    for point in SSVAE_POINTS:  # every number of both seeds; times and hosts aside
        expected, got = (comparable(w / "results" / point) for w in (reference, workdir))
        assert got == expected, point
    run = f"{SCALING_RUN}/run.json"
    expected, got = (json.loads((w / "results" / run).read_text()) for w in (reference, workdir))
    for mine, theirs in zip(got["epochs"], expected["epochs"], strict=True):
        for field in ("train_loss", "val_loss", "val_accuracy"):
            assert mine[field] == theirs[field], (field, mine["epoch"])
    # weights, optimizer and schedule came back, and every epoch seeds its shuffle and dropout
    assert_same_weights(*(w / "results" / SCALING_RUN / "model.pt" for w in (reference, workdir)))


def test_a_second_instance_in_the_same_folder_gets_the_lock_message(reference, tmp_path):
    """The first run's forced sweep shard waits until the second run has ended (a `hold-until`
    fault), so it surely holds the lock while the second starts: a run of fast jobs could end
    before the second looks."""
    workdir = tmp_path / "work"
    shutil.copytree(reference, workdir, symlinks=True)
    shard = "results/sweep/shards/method~gd/rank~2/width~4/shard~0.csv"
    release = tmp_path / "second-run-ended"
    held = grid_faults.install(tmp_path / "faulty-bin", {"shard~0.csv": f"hold-until:{release}"})
    first = start(workdir, shard, "--forcerun", "sweep_shard", env=held)
    try:
        locks = lambda: list((workdir / ".snakemake" / "locks").glob("*.lock"))  # noqa: E731
        wait_while_running(locks, first, "the first run's lock", 120, 0.02)
        second = snakemake(workdir, TINY_ALL, shard, "--forcerun", "sweep_shard", check=False)
    finally:
        release.touch()
        status = first.wait(timeout=600)
    assert second.returncode != 0
    assert "Directory cannot be locked" in second.stdout + second.stderr
    assert status == 0
    assert (workdir / shard).stat().st_mtime_ns > (reference / shard).stat().st_mtime_ns
    assert not incomplete_outputs(workdir, reference)
    table, expected = (pd.read_csv(w / shard) for w in (workdir, reference))
    pd.testing.assert_frame_equal(table.drop(columns="wall_s"), expected.drop(columns="wall_s"))


def test_corrupted_resume_states_are_reported_and_the_jobs_start_over(reference, tmp_path):
    workdir = tmp_path / "work"
    shutil.copytree(reference, workdir, symlinks=True)
    # imdb at one process: 12 optimizer steps (short's world~1 takes 240)
    scaling_state = SCALING_STATE.replace("short", "imdb").replace("world~2", "world~1")
    (workdir / SSVAE_STATE).write_bytes(b"PK\x03\x04" + bytes(200))  # a zip cut short
    torch.save({"fingerprint": "x", "model": torch.zeros(4096)}, workdir / scaling_state)
    whole = (workdir / scaling_state).read_bytes()
    (workdir / scaling_state).write_bytes(whole[: len(whole) // 2])  # truncated
    # A finished shard keeps no state: write the one a killed job would leave, cut short.
    sweep_state = SWEEP_STATE.replace("method~gnc", "method~gd")
    (workdir / sweep_state).write_bytes(whole[: len(whole) // 3])
    targets = [
        "results/ssvae/frac~0.1/corrupt~0.5/alpha~1/seed~0/metrics.json",
        "results/scaling/runs/imdb/nodes~1/world~1/run.json",
        "results/sweep/shards/method~gd/rank~2/width~4/shard~0.csv",
    ]
    # The targets come first: --forcerun takes every word after it as a rule name.
    snakemake(
        workdir, TINY_ALL, *targets, "--forcerun", "ssvae_train", "scaling_train", "sweep_shard"
    )
    logs = workdir / "results"
    ssvae = (logs / "ssvae/logs/train/frac~0.1/corrupt~0.5/alpha~1.log").read_text()
    assert f"ignoring {SSVAE_STATE}: unreadable resume state" in ssvae
    scaling = (logs / "scaling/logs/train/imdb/nodes~1/world~1.log").read_text()
    assert f"ignoring {scaling_state}: unreadable resume state" in scaling
    sweep = (logs / "sweep/logs/method~gd/rank~2/width~4/shard~0.log").read_text()
    assert f"ignoring {sweep_state}: unreadable resume state" in sweep
    assert "0 already done" in sweep
    for target in targets[:2]:
        expected, got = (json.loads((w / target).read_text()) for w in (reference, workdir))
        curve = "curve" if "ssvae" in target else "epochs"
        fields = ("train_loss", "val_loss", "val_accuracy") if curve == "epochs" else None
        for mine, theirs in zip(got[curve], expected[curve], strict=True):
            keys = fields or [k for k in theirs if "time" not in k]
            assert {k: mine[k] for k in keys} == {k: theirs[k] for k in keys}
    shard = [pd.read_csv(w / targets[2])[["seed", "test_error"]] for w in (reference, workdir)]
    pd.testing.assert_frame_equal(*shard)


# --- the report in a browser ----------------------------------------------------------------

# Category -> the figure labels a person sees listed after clicking it (labels in workflow/rules).
REPORT_FIGURES = {
    "Fluency-toxicity": [
        "binned means", "log-perplexity vs toxicity", "per group", "summary", "summary tables",
    ],
    "SSVAE grid": [
        "accuracy vs label fraction", "alpha x fraction", "label corruption", "M2 vs baseline",
        "summary", "summary tables",
    ],
    "DDP scaling": [
        "epoch time", "speedup and efficiency", "throughput", "validation accuracy",
        "compute vs communication", "performance report", "summary tables",
    ],
    "Seed sweeps": [
        "test error vs student width", "guesses needed", "summary table", "summary tables",
    ],
}  # fmt: skip
REPORT_FILES = [
    "logppl_vs_toxicity.png", "binned_means.png", "by_group.png", "accuracy_vs_fraction.png",
    "alpha_fraction_heatmap.png", "corruption_effect.png", "m2_vs_baseline.png",
    "epoch_time.png", "speedup_efficiency.png", "throughput.png", "accuracy.png",
    "compute_comm.png", "performance_report.txt", "test_error.png", "guesses.png", "summary.csv",
    "summary.md", "tables.html",
]  # fmt: skip
# Each family's summary tables, drawn inline in the report (from their CSV files).
REPORT_TABLES = [
    "correlations.csv", "binned.csv", "summary.csv", "comprehensive_summary.csv", "cost_table.csv",
]  # fmt: skip

# What a person does: wait for the page, then click a category in the menu.
CLICK = """<script>
window.addEventListener("load", () => setTimeout(() => {
  const item = [...document.querySelectorAll("#app *")].find(
    (el) => el.children.length === 0 && el.textContent.trim() === %s);
  if (item) item.click();
}, 200));
</script>"""


def chromium() -> str:
    """Debian's chromium, installed with apt-get when missing (root, as the SLURM tests do)."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0:
        reason = "chromium is missing and installing it needs root"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (under CI the report must be opened: install it or run as root)")
        pytest.skip(reason)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        subprocess.run(command, check=True, capture_output=True, env=env, timeout=900)
    return shutil.which("chromium") or pytest.fail("apt-get installed no chromium")


def browse(html: Path, profile: Path, *args: str) -> str:
    """Open `html` in headless Chromium with no network services; return its stdout.

    Headless Chromium now and then hangs after the page has loaded (once in eleven fresh-clone
    runs, killed at 180 s): a browser still running after 90 s is killed with all its
    processes and started once more, with a fresh profile.
    """
    try:
        return run_browser(html, profile / "1", args)
    except subprocess.TimeoutExpired:
        return run_browser(html, profile / "2", args)


def run_browser(html: Path, profile: Path, args: tuple[str, ...]) -> str:
    """One headless Chromium run on `html`; killed with its processes after 90 s."""
    command = [
        chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
        "--virtual-time-budget=10000", *args, html.as_uri(),
    ]  # fmt: skip
    browser = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = browser.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        kill_tree(browser.pid)
        browser.communicate()
        raise
    if browser.returncode != 0:
        raise subprocess.CalledProcessError(browser.returncode, command, out, err)
    return out


def rendered_text(dom: str) -> str:
    """The text the app drew (inside <div id="app">), without markup."""
    start = dom.index('id="app"')
    app = dom[start : dom.index("<script", start)]
    return " ".join(re.sub(r"<[^>]+>", " ", app).split())


@pytest.fixture(scope="module")
def report(reference: Path) -> Path:
    snakemake(reference, TINY_ALL, "--report", "results/report.html")
    return reference / "results" / "report.html"


def test_status_after_the_run_counts_every_job_of_every_family_done(reference):
    where = ["--directory", str(reference), "--configfile", str(config_file(reference, TINY_ALL))]
    result = subprocess.run(
        [str(BIN / "gpuflow"), "status", "--json", "--snakefile", str(REPO / "Snakefile"), *where],
        capture_output=True,
        text=True,
        env=workflow_env(),
        check=True,
    )
    status = json.loads(result.stdout)
    # every family's rules, and the run's timeline drawn after them
    assert {row["family"] for row in status["rules"]} == {*TINY_ALL["families"], "timeline"}
    totals = status["totals"]
    assert totals["jobs"] > 20 and totals["done"] == totals["jobs"], status["rules"]
    assert status["running"] == status["failed"] == status["incomplete"] == []
    assert not status["run_active"] and totals["hours_left"] == 0


def test_every_familys_summary_tables_are_html_pages_inside_the_report(report):
    html = report.read_text(encoding="utf-8")
    pages = [
        base64.b64decode(data).decode("utf-8")
        for data in re.findall(r"data:text/html;[^,\"']*base64,([A-Za-z0-9+/=]+)", html)
    ]
    titles = {re.search(r"<h1>(.*?)</h1>", page)[1] for page in pages if "<h1>" in page}
    assert {title.split(":")[0] for title in titles} == set(REPORT_FIGURES), titles
    tables = " ".join(pages)
    for name in REPORT_TABLES:
        assert re.search(rf"<h2>{re.escape(name)} \(\d+ rows\)</h2>\s*<table", tables), name


def test_the_report_file_holds_every_figure_with_its_caption_and_category(report):
    html = report.read_text(encoding="utf-8", errors="replace")
    for name in REPORT_FILES:
        assert name in html, name
    for category in REPORT_FIGURES:
        assert category in html, category
    for caption in sorted((REPO / "workflow" / "report").glob("*_*.rst")):
        first_line = caption.read_text(encoding="utf-8").strip().splitlines()[0]
        assert " ".join(first_line.split()[:4]) in html, caption.name


def test_the_report_renders_in_a_headless_browser(report, tmp_path):
    screenshot = tmp_path / "report.png"
    browse(report, tmp_path / "profile", f"--screenshot={screenshot}", "--window-size=1280,900")
    from PIL import Image

    image = np.asarray(Image.open(screenshot).convert("L"), dtype=float)
    assert image.shape == (900, 1280)
    assert image.std() > 10, "the page is blank"
    assert (image < 128).mean() > 0.005, "no text or graph drawn"
    shutil.copy(screenshot, report.with_name("report-screenshot.png"))
    text = rendered_text(browse(report, tmp_path / "profile2", "--dump-dom"))
    for category in REPORT_FIGURES:
        assert category in text, (category, text[:500])


@pytest.mark.parametrize("category", sorted(REPORT_FIGURES))
def test_clicking_a_category_lists_its_figures(report, tmp_path, category):
    html = report.read_text(encoding="utf-8")
    end = html.rindex("</body>")
    page = report.with_name(f"report-click-{category.replace(' ', '_')}.html")
    page.write_text(html[:end] + CLICK % json.dumps(category) + html[end:], encoding="utf-8")
    text = rendered_text(browse(page, tmp_path / "profile", "--dump-dom"))
    assert f"Results {category}" in text, text[:500]
    for label in REPORT_FIGURES[category]:
        assert label in text, (label, text[:1000])
