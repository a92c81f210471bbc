"""Two writers of one output: the second is refused at once and nothing is corrupted.

After a killed submitter, `snakemake --unlock` and the same command start jobs whose earlier
copies still run. The test does exactly that on one target: a first Snakemake runs a sweep
shard, held inside its step (a `seed-hold-until` fault, tests/slurm/grid_faults.py) until the
test lets it go; meanwhile `--unlock` and a second Snakemake on the same target. The second job
must fail with one line naming the first writer, the first must finish, and its output must equal
an undisturbed run's. A training step holds its outputs' locks as well, from its start, not only
for the length of a write: a second `gpuflow ssvae-train` on the same outputs is refused while the
first trains.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from gpuflow.job.outputlock import OutputTakenError, exclusive_output, lock_path
from tests.conftest import (
    BIN,
    REPO,
    config_file,
    snakemake,
    wait_for,
    wait_for_file,
    workflow_env,
)
from tests.slurm import grid_faults
from tests.test_ssvae_train import comparable, data_path, train_command

__all__ = ["data_path"]  # the fixture, shared with the SSVAE training tests

SHARD = "results/sweep/shards/method~gnc/rank~2/width~4/shard~0.csv"
SHARD_LOG = "results/sweep/logs/method~gnc/rank~2/width~4/shard~0.log"
SHARD_CONFIG = {
    "families": ["sweep"],
    "sweep": {
        "teacher_ranks": [2],
        "student_widths": [4],
        "n_seeds": 2,
        "shard_size": 2,
        "cpu_workers": 1,
    },
}


def start_snakemake(
    workdir: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """The repository's workflow in `workdir` on SHARD_CONFIG, in the workflow's environment
    with `env`'s entries over it."""
    command = [
        str(BIN / "snakemake"),
        "--snakefile", str(REPO / "Snakefile"),
        "--directory", str(workdir),
        "--configfile", str(config_file(workdir, SHARD_CONFIG)),
        "--cores", "1",
        *args,
    ]  # fmt: skip
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**workflow_env(), **(env or {})},
    )


def without_times(table: pd.DataFrame) -> pd.DataFrame:
    """The table's numbers, without the wall-clock column."""
    return table.drop(columns=["wall_s"])


@pytest.mark.workflow
def test_a_second_run_of_a_running_target_is_refused_and_the_first_output_is_intact(tmp_path):
    reference, shared = tmp_path / "reference", tmp_path / "shared"
    snakemake(reference, SHARD_CONFIG, SHARD)
    snakemake(shared, SHARD_CONFIG, "--dry-run", SHARD)  # the folder, its config; runs nothing
    release = tmp_path / "second-run-refused"
    held = grid_faults.install(tmp_path / "bin", {"shard~0.csv": f"seed-hold-until:{release}"})
    first = start_snakemake(shared, SHARD, env=held)
    try:
        lock = shared / lock_path(SHARD)
        wait_for(lambda: "computing" in _read(shared / SHARD_LOG), "the first job to start", 120)
        assert f"host {socket.gethostname()}" in lock.read_text()
        unlock = start_snakemake(shared, "--unlock")
        assert unlock.wait(timeout=120) == 0, unlock.stdout.read() if unlock.stdout else ""
        second = start_snakemake(shared, SHARD)
        second_output = second.communicate(timeout=300)[0]
        second_log = _read(shared / SHARD_LOG)
        assert first.poll() is None, "the first job was still running when the second was refused"
        release.touch()
        first_output = first.communicate(timeout=300)[0]
    finally:
        release.touch()
        if first.poll() is None:
            first.kill()
    assert second.returncode != 0, second_output
    refusal = [line for line in second_log.splitlines() if "another job is writing" in line]
    assert len(refusal) == 1, second_log
    assert f"{shared / SHARD}" in refusal[0] or SHARD in refusal[0]
    assert f"host {socket.gethostname()}, pid " in refusal[0]
    assert "SLURM job -" in refusal[0]
    assert "Traceback" not in second_log
    assert first.returncode == 0, first_output
    pd.testing.assert_frame_equal(
        without_times(pd.read_csv(shared / SHARD)), without_times(pd.read_csv(reference / SHARD))
    )
    leftovers = [p.name for p in (shared / SHARD).parent.iterdir() if ".tmp-" in p.name]
    assert leftovers == []
    again = snakemake(shared, SHARD_CONFIG, "--dry-run", SHARD)
    assert "Nothing to be done" in again.stdout + again.stderr


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


HELD_IN_ITS_FIRST_EPOCH = """
import sys, time
from pathlib import Path
from gpuflow.cli import main
from gpuflow.ssvae.train import StackTrainer

started, release, train_epoch = Path(sys.argv[1]), Path(sys.argv[2]), StackTrainer.train_epoch

def held(self):
    started.touch()
    while not release.exists():
        time.sleep(0.05)
    return train_epoch(self)

StackTrainer.train_epoch = held
sys.exit(main(sys.argv[3:]))
"""


def test_a_second_training_of_a_running_target_is_refused_and_the_first_output_is_intact(
    data_path, tmp_path
):
    """The first training is held in its first epoch (HELD_IN_ITS_FIRST_EPOCH) until the second
    has ended: the two overlap for sure, on a quiet machine as on a busy one."""
    reference, shared = tmp_path / "reference", tmp_path / "shared"
    reference.mkdir()
    shared.mkdir()
    subprocess.run(
        train_command(data_path, reference, 3), check=True, env=workflow_env(), capture_output=True
    )
    command = train_command(data_path, shared, 3)
    started, release = tmp_path / "first-trains", tmp_path / "second-refused"
    first = subprocess.Popen(
        [str(BIN / "python"), "-c", HELD_IN_ITS_FIRST_EPOCH, str(started), str(release),
         *command[1:]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**workflow_env(), "SLURM_JOB_ID": "4242"},
    )  # fmt: skip
    try:
        wait_for_file(started, first, 120)
        second = subprocess.run(command, capture_output=True, text=True, env=workflow_env())
        assert first.poll() is None, "the first training was still running when the second ended"
        written_meanwhile = [p.name for p in shared.glob("seed~*")]
        release.touch()
        _, first_err = first.communicate(timeout=120)
    finally:
        release.touch()
        if first.poll() is None:
            first.kill()
    refusal = second.stderr.splitlines()
    assert second.returncode == 2 and len(refusal) == 1, second.stdout + second.stderr
    assert refusal[0].startswith(
        f"gpuflow ssvae-train: error: {shared / 'seed~4.json'}: another job is writing this"
        f" output (host {socket.gethostname()}, pid {first.pid}, SLURM job 4242, since "
    ), refusal
    assert written_meanwhile == [], "the refused training wrote nothing"
    assert first.returncode == 0, first_err
    for name in ("seed~4.json", "seed~9.json"):
        assert comparable(shared / name) == comparable(reference / name)
    assert sorted(p.name for p in shared.iterdir()) == ["jobs", "seed~4.json", "seed~9.json"]


def test_an_output_lock_names_its_holder_and_frees_with_the_holder(tmp_path):
    out = tmp_path / "table.csv"
    holder = subprocess.Popen(
        [
            str(BIN / "python"), "-c",
            "import sys, time; from gpuflow.job.outputlock import exclusive_output\n"
            "with exclusive_output(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)",
            str(out),
        ],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "SLURM_JOB_ID": "4242"},
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        taken = pytest.raises(OutputTakenError, match=rf"pid {holder.pid}, SLURM job 4242")
        with taken as refused, exclusive_output(out):
            pass
        assert str(out) in str(refused.value)
    finally:
        holder.kill()
        holder.wait()
    with exclusive_output(out):  # the kernel dropped the killed holder's lock
        assert lock_path(out).read_text().startswith(f"host {socket.gethostname()}, pid")
