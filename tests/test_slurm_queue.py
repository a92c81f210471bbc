"""What squeue and sacct say about a run's jobs, read from their delimited text captured on
SLURM 22.05.8 (Debian 12's packages, tests/slurm/captured/README.md): the records agree with
what `--json` said of the same jobs, which gpuflow no longer reads."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpuflow.errors import GpuflowError
from gpuflow.slurm import queue
from gpuflow.slurm.earlier_jobs import check_no_earlier_jobs, earlier_jobs
from gpuflow.slurm.queue import SlurmJob, parse_sacct_text, parse_text
from tests.conftest import wait_for

CAPTURED = Path(__file__).parent / "slurm" / "captured"
SQUEUE_RUN = "/tmp/h-slurm-cap"  # the run's folder when squeue.* were captured
SACCT_RUN = "/tmp/h-slurm-acct/run"  # and when sacct.* were
OOM_RUN = "/tmp/pytest-of-root/pytest-305/cluster0"  # and sacct-oom.*
OOM_RULE = "rule_ssvae_train_wildcards_0.2_0.0_10"

SQUEUE_EXPECTED = [
    SlurmJob("3", "", "FAILED", "other", "/tmp", "2026-11-24T03:53:26", "2026-11-24T03:53:26"),
    SlurmJob(
        "5",
        "rule_sweep_shard_wildcards_gd_8_8_1",
        "RUNNING",
        "gpuflow_capture",
        SQUEUE_RUN,
        "2026-11-24T03:58:39",
    ),
    SlurmJob("6", "rule_quick", "PENDING", "gpuflow_capture", SQUEUE_RUN, "2026-11-24T04:58:39"),
    SlurmJob(
        "7",
        "rule_broken",
        "FAILED",
        "gpuflow_capture",
        SQUEUE_RUN,
        "2026-11-24T03:58:39",
        "2026-11-24T03:58:39",
    ),
    SlurmJob(
        "8",
        "rule_sweep_shard_wildcards_gd_8_8_0",
        "COMPLETED",
        "gpuflow_capture",
        SQUEUE_RUN,
        "2026-11-24T03:58:39",
        "2026-11-24T03:58:39",
    ),
]
SQUEUE_RUN_JOBS = SQUEUE_EXPECTED[1:]


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    """SLURM printed its times in UTC, the capturing machine's local time."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def captured(name: str) -> str:
    return (CAPTURED / name).read_text(encoding="utf-8")


def by_id(jobs: list[SlurmJob]) -> list[SlurmJob]:
    return sorted(jobs, key=lambda job: int(job.job_id))


def json_jobs(name: str) -> dict[str, tuple[str, str, str, str]]:
    """(comment, state, name, workdir) by job id, as the captured `--json` of the same jobs
    says (openapi v0.0.38 of 22.05): what the text must agree with."""
    found = {}
    for job in json.loads(captured(name))["jobs"]:
        comment = job.get("comment")
        comment = (comment.get("job") if isinstance(comment, dict) else comment) or ""
        state = job["state"]["current"] if "state" in job else job["job_state"]
        workdir = job.get("working_directory") or job.get("current_working_directory")
        found[str(job["job_id"])] = (comment, state, job["name"], workdir)
    return found


def fields(job: SlurmJob) -> tuple[str, str, str, str]:
    return (job.comment, job.state, job.name, job.workdir)


def test_squeue_text_gives_the_callers_jobs_as_its_json_does():
    jobs = by_id(parse_text(captured("squeue.txt")))
    assert jobs == SQUEUE_EXPECTED
    from_json = json_jobs("squeue.json")
    assert {job.job_id: fields(job) for job in jobs} == {
        job_id: record for job_id, record in from_json.items() if job_id != "4"
    }, "job 4 is nobody's: --me leaves it out of the text (22.05's --json ignored --me)"
    assert "--me" in queue.SQUEUE_TEXT


def test_sacct_text_gives_the_jobs_its_json_does():
    expected = [
        ("1", "", "COMPLETED", "2026-11-24T03:55:38", "2026-11-24T03:55:39"),
        ("3", "", "RUNNING", "2026-11-24T03:55:38", ""),
        ("5", "", "COMPLETED", "2026-11-24T03:55:38", "2026-11-24T03:55:39"),
        ("6", "rule_quick", "COMPLETED", "2026-11-24T03:56:00", "2026-11-24T03:56:01"),
        ("7", "rule_broken", "FAILED", "2026-11-24T03:56:00", "2026-11-24T03:56:01"),
        ("8", "rule_slow", "CANCELLED", "2026-11-24T03:56:00", "2026-11-24T03:56:04"),
    ]
    jobs = by_id(parse_sacct_text(captured("sacct.txt")))
    assert [(j.job_id, j.comment, j.state, j.started, j.ended) for j in jobs] == expected
    assert {job.job_id: fields(job) for job in jobs} == json_jobs("sacct.json")
    assert {job.workdir for job in jobs} == {SACCT_RUN, "/tmp"}
    assert [job.job_id for job in jobs if job.active] == ["3"]


@pytest.mark.parametrize(
    ("printed", "state"),
    [
        ("CANCELLED by 0", "CANCELLED"),  # sacct, a job ended by scancel (captured: job 8)
        ("CANCELLED by 1000", "CANCELLED"),
        ("CANCELLED", "CANCELLED"),  # squeue
        ("NODE_FAIL", "NODE_FAIL"),
        ("OUT_OF_MEMORY", "OUT_OF_MEMORY"),
        ("PENDING", "PENDING"),
    ],
)
def test_a_state_is_read_by_its_first_word(printed, state):
    line = f"9|gpuflow_x|rule_a|{printed}|/tmp|2026-11-24T03:56:00|2026-11-24T03:56:04"
    [job] = parse_sacct_text(line)
    assert job.state == state
    assert job.ended == ("" if state == "PENDING" else "2026-11-24T03:56:04"), "active: no end"


def test_sacct_is_asked_with_the_steps_of_each_job():
    """--allocations would leave the steps out."""
    assert "--parsable2" in queue.SACCT_TEXT and "--allocations" not in queue.SACCT_TEXT


def test_a_job_whose_step_ran_out_of_memory_is_out_of_memory_not_failed():
    """sacct-oom.*: an SSVAE training job killed by its memory cgroup on the test cluster;
    SLURM says FAILED (the batch step failed after step 0, the training, ended OUT_OF_MEMORY)."""
    [(_, state, _, _)] = json_jobs("sacct-oom.json").values()
    assert state == "FAILED"
    expected = SlurmJob(
        "1",
        OOM_RULE,
        "OUT_OF_MEMORY",
        "gpuflow_12a18b5f-68e7-44dd-bab4-d274e591b722",
        OOM_RUN,
        "2026-11-24T17:33:19",
        "2026-11-24T17:33:28",
    )
    assert parse_sacct_text(captured("sacct-oom.txt")) == [expected]


def test_a_job_that_failed_with_no_step_out_of_memory_stays_failed():
    text = captured("sacct-oom.txt").replace("OUT_OF_MEMORY", "FAILED")
    assert parse_sacct_text(text)[0].state == "FAILED"


def fake_command(bin_dir: Path, name: str, out: str) -> Path:
    """A stand-in for `name` that logs its arguments and prints `out`."""
    log = bin_dir / f"{name}.calls"
    (bin_dir / f"{name}.text").write_text(out, encoding="utf-8")
    script = bin_dir / name
    script.write_text(
        f'#!/bin/sh\nPATH=/usr/bin:/bin\necho "$*" >> "{log}"\ncat "{bin_dir}/{name}.text"\n'
    )
    script.chmod(0o755)
    return log


@pytest.fixture
def bin_dir(tmp_path, monkeypatch):
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", str(folder))
    return folder


def test_squeue_is_read_as_text(bin_dir):
    log = fake_command(bin_dir, "squeue", captured("squeue.txt"))
    assert by_id(queue.squeue_jobs(SQUEUE_RUN)) == SQUEUE_RUN_JOBS
    assert queue.squeue_jobs("/tmp") == [], "job 3 there is no gpuflow job"
    assert log.read_text().splitlines() == [" ".join(queue.SQUEUE_TEXT[1:])] * 2, "asked twice"


def test_the_newest_job_of_each_rule_wins_and_squeue_is_read_over_sacct(bin_dir):
    fake_command(bin_dir, "sacct", captured("sacct.txt"))
    squeue_now = [
        f"8|gpuflow_capture|rule_slow|COMPLETING|{SACCT_RUN}|2026-11-24T03:56:00|Unknown",
        f"9|gpuflow_capture|rule_broken|RUNNING|{SACCT_RUN}|2026-11-24T03:57:00|Unknown",
    ]
    fake_command(bin_dir, "squeue", "\n".join(squeue_now))
    jobs, _ = queue.status_jobs(SACCT_RUN)
    assert {comment: job.job_id for comment, job in jobs.items()} == {
        "": "3",
        "rule_quick": "6",
        "rule_broken": "9",
        "rule_slow": "8",
    }
    assert (jobs["rule_broken"].state, jobs["rule_slow"].state) == ("RUNNING", "COMPLETING")


def test_an_ended_job_keeps_what_sacct_knows_over_squeue(bin_dir):
    """squeue says FAILED for the job whose step ran out of memory; sacct knows why."""
    fake_command(bin_dir, "sacct", captured("sacct-oom.txt"))
    line = f"1|gpuflow_12a1|{OOM_RULE}|FAILED|{OOM_RUN}|2026-11-24T17:33:19|2026-11-24T17:33:28"
    fake_command(bin_dir, "squeue", line)
    assert queue.status_jobs(OOM_RUN)[0][OOM_RULE].state == "OUT_OF_MEMORY"


def test_without_slurm_commands_a_run_has_no_slurm_jobs(bin_dir):
    assert queue.status_jobs(SACCT_RUN) == ({}, None)
    assert earlier_jobs(SACCT_RUN) == []


def test_queued_and_running_jobs_of_an_earlier_run_block_their_targets_only(bin_dir):
    fake_command(bin_dir, "squeue", captured("squeue.txt"))
    assert sorted(job.job_id for job in earlier_jobs(SQUEUE_RUN)) == ["5", "6"], "not 7, 8: ended"
    check_no_earlier_jobs([("sweep_shard", ["gd", "8", "8", "0"]), ("broken", [])], SQUEUE_RUN)
    with pytest.raises(GpuflowError) as error:
        planned = [("sweep_shard", ["gd", "8", "8", "1"]), ("quick", [])]
        check_no_earlier_jobs(planned, SQUEUE_RUN)
    assert str(error.value) == (
        "2 SLURM job(s) of an earlier run still write targets of this run: "
        "5 (rule_sweep_shard_wildcards_gd_8_8_1, RUNNING), 6 (rule_quick, PENDING). "
        "Wait for them (squeue --me) or end them with: scancel 5 6"
    )


def unreachable_command(bin_dir: Path, name: str, seconds: float) -> Path:
    """A stand-in for `name` with the controller down: it waits `seconds` in a child process
    (whose pid it writes to <name>.child), then says it could not contact the controller, as
    SLURM 22.05's squeue does after retrying. Returns the file its calls are logged to."""
    log = bin_dir / f"{name}.calls"
    script = bin_dir / name
    script.write_text(
        "#!/bin/sh\nPATH=/usr/bin:/bin\n"
        f'echo "$*" >> "{log}"\n'
        f'sleep {seconds} & echo $! > "{bin_dir}/{name}.child"; wait\n'
        'echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2\n'
        "exit 1\n"
    )
    script.chmod(0o755)
    return log


def running(pid: int) -> bool:
    """Whether process `pid` exists and is no zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_status_jobs_give_a_controller_that_does_not_answer_their_timeout_only(bin_dir):
    """squeue is killed at the timeout with what it started, nothing is read from sacct (whose
    records the controller no longer updates)."""
    squeue_calls = unreachable_command(bin_dir, "squeue", 60)
    sacct_calls = unreachable_command(bin_dir, "sacct", 60)
    started = time.monotonic()
    assert queue.status_jobs(SACCT_RUN, timeout=0.5) == ({}, "squeue: no answer in 0.5 s")
    assert time.monotonic() - started < 3
    assert squeue_calls.read_text().splitlines() == [" ".join(queue.SQUEUE_TEXT[1:])]
    assert not sacct_calls.exists()
    child = int((bin_dir / "squeue.child").read_text())
    wait_for(lambda: not running(child), "the killed squeue's child to be gone", timeout=5)


def test_a_command_that_cannot_contact_the_controller_names_it(bin_dir):
    unreachable_command(bin_dir, "squeue", 0)
    reason = "squeue: Unable to contact slurm controller (connect failure)"
    assert queue.status_jobs(SACCT_RUN) == ({}, reason)
    assert queue.squeue_jobs(SACCT_RUN) == []


def test_squeue_s_jobs_stand_also_where_sacct_gets_no_answer(bin_dir):
    """Where sacct alone gets no answer (its database is down), squeue's jobs stand, as a
    failing squeue (jobs past MinJobAge) leaves sacct's."""
    fake_command(bin_dir, "sacct", captured("sacct.txt"))
    line = f"9|gpuflow_capture|rule_broken|RUNNING|{SACCT_RUN}|2026-11-24T03:57:00|Unknown"
    fake_command(bin_dir, "squeue", line)
    jobs, unreachable = queue.status_jobs(SACCT_RUN)
    assert jobs["rule_broken"].job_id == "9" and jobs["rule_quick"].job_id == "6"
    assert unreachable is None
    unreachable_command(bin_dir, "sacct", 60)
    [job] = queue.status_jobs(SACCT_RUN, timeout=0.5)[0].values()
    assert job.job_id == "9"
