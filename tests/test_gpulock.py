"""Device locks: concurrent jobs on one machine get distinct GPUs, and a killed job frees its."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuflow.errors import GpuflowError
from gpuflow.gpulock import acquire, device_pool, requested_gpus

BIN = Path(sys.executable).parent


def lock_env(lock_dir: Path, n_gpus: int | None, devices: str = "0,1,2,3") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLOW_GPU")}
    env.update({"GPUFLOW_GPU_LOCK_DIR": str(lock_dir), "GPUFLOW_GPU_DEVICES": devices})
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    if n_gpus is not None:
        env["GPUFLOW_GPUS"] = str(n_gpus)
    return env


def visible(env: dict[str, str], hold: float = 0.0) -> subprocess.Popen[str]:
    """`gpuflow with-gpus` running a shell that prints what it sees, then waits `hold` s."""
    script = f'echo "$CUDA_VISIBLE_DEVICES"; sleep {hold}'
    return subprocess.Popen(
        [str(BIN / "gpuflow"), "with-gpus", "--", "sh", "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_four_concurrent_one_gpu_steps_see_four_distinct_devices(tmp_path):
    jobs = [visible(lock_env(tmp_path, 1), hold=2) for _ in range(4)]
    seen = [job.communicate()[0].strip() for job in jobs]
    assert sorted(seen) == ["0", "1", "2", "3"]


def test_a_fifth_job_waits_until_a_device_is_free(tmp_path):
    holders = [visible(lock_env(tmp_path, 1), hold=3) for _ in range(4)]
    time.sleep(1.5)
    started = time.monotonic()
    fifth = visible(lock_env(tmp_path, 1))
    assert fifth.communicate()[0].strip() in {"0", "1", "2", "3"}
    assert time.monotonic() - started > 0.5
    for job in holders:
        job.wait()


def test_a_two_gpu_step_gets_two_devices(tmp_path):
    out = visible(lock_env(tmp_path, 2)).communicate()[0].strip()
    assert len(out.split(",")) == 2


def test_a_killed_job_frees_its_device(tmp_path):
    """A job is its process tree (the command and its children hold the locks), killed whole."""
    holder = visible(lock_env(tmp_path, 4), hold=60)
    assert holder.stdout.readline().strip() == "0,1,2,3"
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    assert visible(lock_env(tmp_path, 4)).communicate(timeout=20)[0].strip() == "0,1,2,3"


def test_a_cpu_step_sees_no_gpu_where_devices_are_locked(tmp_path):
    assert visible(lock_env(tmp_path, None)).communicate()[0].strip() == ""


def test_without_a_lock_dir_nothing_changes(tmp_path):
    env = lock_env(tmp_path, 1)
    del env["GPUFLOW_GPU_LOCK_DIR"]
    env["CUDA_VISIBLE_DEVICES"] = "2"
    assert visible(env).communicate()[0].strip() == "2"


def test_steps_record_the_locked_device(tmp_path):
    out = tmp_path / "record.json"
    subprocess.run(
        [str(BIN / "gpuflow"), "probe", "--out", str(out)],
        env=lock_env(tmp_path / "locks", 1, devices="5,6"),
        check=True,
    )
    assert json.loads(out.read_text())["cuda_visible_devices"] == "5"


def test_asking_for_more_gpus_than_shared_is_an_error(tmp_path):
    with pytest.raises(GpuflowError, match="asks for 3 GPUs but only 2"):
        acquire(3, tmp_path, ["0", "1"])


def test_a_bad_gpu_count_is_an_error():
    env = {"GPUFLOW_GPU_LOCK_DIR": "/tmp/x", "GPUFLOW_GPUS": "four"}
    with pytest.raises(GpuflowError, match="not a number"):
        requested_gpus(env)


def test_the_device_pool_follows_the_allocation():
    assert device_pool({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}) == ["4", "5", "6", "7"]
    assert device_pool({"GPUFLOW_GPU_DEVICES": "1,3", "CUDA_VISIBLE_DEVICES": "9"}) == ["1", "3"]
