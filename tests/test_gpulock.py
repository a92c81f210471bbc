"""Device locks: concurrent jobs on one machine get distinct GPUs, and a killed job frees its."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpuflow.errors import GpuflowError
from gpuflow.job.gpulock import acquire, device_pool, requested_gpus

BIN = Path(sys.executable).parent


def lock_env(lock_dir: Path, n_gpus: int | None, devices: str = "0,1,2,3") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFLOW_GPU", "SLURM_"))}
    env.update({"GPUFLOW_GPU_LOCK_DIR": str(lock_dir), "GPUFLOW_GPU_DEVICES": devices})
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    if n_gpus is not None:
        env["GPUFLOW_GPUS"] = str(n_gpus)
    return env


def visible(
    env: dict[str, str], hold: float = 0.0, release: Path | None = None
) -> subprocess.Popen[str]:
    """`gpuflow with-gpus` running a shell that prints what it sees, then waits `hold` s (or
    with `release`, until that file exists).

    Its second and third lines are the clock (epoch seconds) when it got the devices and when
    it is about to let them go.
    """
    wait = f"sleep {hold}" if release is None else f"until [ -e '{release}' ]; do sleep 0.05; done"
    script = f'echo "$CUDA_VISIBLE_DEVICES"; date +%s.%N; {wait}; date +%s.%N'
    return subprocess.Popen(
        [str(BIN / "gpuflow"), "with-gpus", "--", "sh", "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_four_concurrent_one_gpu_steps_see_four_distinct_devices(tmp_path):
    release = tmp_path / "release"
    jobs = [visible(lock_env(tmp_path, 1), release=release) for _ in range(4)]
    try:
        seen = [job.stdout.readline().strip() for job in jobs if job.stdout]  # all four hold one
    finally:
        release.touch()
    assert sorted(seen) == ["0", "1", "2", "3"]
    assert [job.wait(timeout=60) for job in jobs] == [0, 0, 0, 0]


def test_a_fifth_job_waits_until_a_device_is_free(tmp_path):
    holders = [visible(lock_env(tmp_path, 1), hold=3) for _ in range(4)]
    for job in holders:
        assert job.stdout is not None and job.stdout.readline().strip() in {"0", "1", "2", "3"}
    fifth_device, fifth_got, _ = visible(lock_env(tmp_path, 1)).communicate()[0].split()
    first_release = min(float(job.communicate()[0].split()[-1]) for job in holders)
    assert fifth_device in {"0", "1", "2", "3"}
    assert float(fifth_got) >= first_release, "the fifth job got a device no one had freed"


def test_a_job_waiting_past_the_timeout_stops_naming_the_holders(tmp_path):
    holder = visible(lock_env(tmp_path, 4), hold=30)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "0,1,2,3"
    env = {**lock_env(tmp_path, 1), "GPUFLOW_GPU_LOCK_TIMEOUT": "1"}
    waiter = subprocess.run(
        [str(BIN / "gpuflow"), "probe", "--out", str(tmp_path / "p.json")],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    assert waiter.returncode == 2
    assert waiter.stderr.strip() == (
        f"gpuflow probe: error: no 1 free GPU(s) in {tmp_path} after waiting 1 s (held by:"
        f" gpu0 pid {holder.pid}, gpu1 pid {holder.pid}, gpu2 pid {holder.pid},"
        f" gpu3 pid {holder.pid}); stop those processes, or set GPUFLOW_GPU_LOCK_TIMEOUT to"
        " wait longer"
    )


def test_a_stray_lock_dir_inside_another_slurm_job_is_ignored(tmp_path):
    """SLURM binds the job's GPUs; a lock dir exported from the submitting shell must not."""
    env = {**lock_env(tmp_path, 1), "SLURM_JOB_ID": "77", "CUDA_VISIBLE_DEVICES": "3"}
    assert visible(env).communicate()[0].split()[0] == "3"
    assert not list(tmp_path.glob("gpu*.lock"))
    whole_node = {**env, "GPUFLOW_GPU_LOCK_JOB": "77"}  # whole-node mode: this job's locks
    assert visible(whole_node).communicate()[0].split()[0] == "0"


def test_a_two_gpu_step_gets_two_devices(tmp_path):
    out = visible(lock_env(tmp_path, 2)).communicate()[0].split()[0]
    assert len(out.split(",")) == 2


def test_a_killed_job_frees_its_device(tmp_path):
    """A job is its process tree (the command and its children hold the locks), killed whole."""
    holder = visible(lock_env(tmp_path, 4), hold=60)
    assert holder.stdout.readline().strip() == "0,1,2,3"
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    assert visible(lock_env(tmp_path, 4)).communicate(timeout=20)[0].split()[0] == "0,1,2,3"


def test_a_cpu_step_sees_no_gpu_where_devices_are_locked(tmp_path):
    assert visible(lock_env(tmp_path, None)).communicate()[0].splitlines()[0] == ""


def test_cuda_counts_devices_by_pci_bus_as_nvidia_smi_and_the_locks_do(tmp_path):
    """CUDA's default order (fastest first) differs from nvidia-smi's and NVML's on a node of
    mixed GPUs: every step tells CUDA to count by PCI bus, unless the user said otherwise."""

    def order(env: dict[str, str]) -> str:
        command = [str(BIN / "gpuflow"), "with-gpus", "--", "sh", "-c", 'echo "$CUDA_DEVICE_ORDER"']
        return subprocess.run(command, env=env, capture_output=True, text=True).stdout.strip()

    env = {k: v for k, v in lock_env(tmp_path, 1).items() if k != "CUDA_DEVICE_ORDER"}
    assert order(env) == "PCI_BUS_ID"
    assert order({**env, "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}) == "FASTEST_FIRST"


def test_without_a_lock_dir_nothing_changes(tmp_path):
    env = lock_env(tmp_path, 1)
    del env["GPUFLOW_GPU_LOCK_DIR"]
    env["CUDA_VISIBLE_DEVICES"] = "2"
    assert visible(env).communicate()[0].split()[0] == "2"


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
