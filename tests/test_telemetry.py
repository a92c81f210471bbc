"""Telemetry of every job, on real processes: the sampler counts a busy child's CPU time and a
child's allocation in peak RSS; without NVML the GPU part says why; every step run through
`gpuflow` leaves its job record (`jobs/<first output>.record.json`, finished or failed) and
holds its summary in its run record; the flags read real recorded numbers."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pynvml
import pytest

from gpuflow.cli import main as gpuflow_main
from gpuflow.job.record import job_record, record_path
from gpuflow.job.record_tables import jobs_section, rule_summary
from gpuflow.job.telemetry.flags import flag, likely_reason
from gpuflow.job.telemetry.job import job_gpus, note
from gpuflow.job.telemetry.nvml import Gpus
from gpuflow.job.telemetry.processes import ProcessTree
from gpuflow.job.telemetry.sampler import Sampler

INTERVAL = 0.05
BUSY_CPU_S = 0.6
ALLOCATED_MB = 200

BUSY_CHILD = f"""
import time
while time.process_time() < {BUSY_CPU_S}:
    pass
time.sleep(0.3)
"""
ALLOCATING_CHILD = f"""
import time
block = b"x" * ({ALLOCATED_MB} * 1024 * 1024)
time.sleep(0.5)
"""


def sampled(code: str) -> dict:
    """The summary of a sampler on this process while a child runs `code` to its end."""
    sampler = Sampler(os.getpid(), INTERVAL, None).start()
    subprocess.run([sys.executable, "-c", code], check=True)
    sampler.stop()
    return sampler.summary()


def own_cpu_s() -> float:
    """CPU seconds of this process so far (all its threads: the sampler's too)."""
    times = psutil.Process().cpu_times()
    return times.user + times.system


def children_cpu_s() -> float:
    """CPU seconds of this process's ended and waited-for children so far (the kernel's count)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_the_cpu_time_of_a_busy_child_process_is_counted():
    own, child = own_cpu_s(), children_cpu_s()
    summary = sampled(BUSY_CHILD)
    own, child = own_cpu_s() - own, children_cpu_s() - child
    cpu = summary["cpu"]
    # The child burns BUSY_CPU_S of CPU (and its interpreter's start-up), then idles while the
    # sampler takes its last look. The tree's root is this process: its share is what it and
    # the sampler thread used meanwhile, measured here apart from the child's.
    assert child >= BUSY_CPU_S
    assert 0.95 * child <= cpu["cpu_seconds"] <= child + own + 0.05, (cpu, child, own)
    assert cpu["cores_busy_mean"] == pytest.approx(cpu["cpu_seconds"] / summary["wall_s"])
    assert cpu["util_percent_mean"] == pytest.approx(
        100 * cpu["cores_busy_mean"] / cpu["allotted_cores"]
    )
    # this process and its child (a pytest-xdist worker may have a helper process of its own)
    assert cpu["peak_processes"] >= 2


def tree_rss_mb() -> float:
    """RSS of this process and its children, as the sampler sums them: a worker process may
    still hold children of an earlier test (a pool's helper), and the sampler counts them too."""
    tree = ProcessTree(os.getpid())
    tree.sample()
    return tree.peak_rss_bytes / 2**20


def test_peak_rss_holds_a_child_process_allocation():
    before = tree_rss_mb()
    summary = sampled(ALLOCATING_CHILD)
    grown = summary["cpu"]["peak_rss_mb"] - before
    # the child's interpreter itself takes ~10 MB besides the block
    assert 0.95 * ALLOCATED_MB <= grown <= ALLOCATED_MB + 60, grown


def nvml_device_count() -> int | None:
    """The GPUs NVML itself reports on this machine, None where it does not start."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def test_the_gpu_part_lists_what_nvml_sees_or_says_why_there_is_none():
    gpus = Gpus(None)
    count = nvml_device_count()
    summary = gpus.summary(wall_s=3600.0, nodes=1)
    if count is None:  # no driver: the reason, no devices, no GPU-hours
        assert gpus.absent is not None and gpus.absent.startswith("NVML init failed: ")
        assert gpus.devices == []
        assert summary == {"absent": gpus.absent, "count": 0, "gpu_hours": 0.0}
    else:  # every device NVML sees, an hour each
        assert gpus.absent is None
        assert len(gpus.devices) == count
        assert summary["count"] == count and summary["gpu_hours"] == pytest.approx(count)


class OneGpuNvml:
    """NVML's answers for one busy GPU, on this machine that has none: the energy counter
    grows with every read, and after the last nvmlShutdown every call fails as the real library
    does (NVMLError_Uninitialized). Only the order of gpuflow's calls is under test here; the
    real library is read by `make gpu-check` on a GPU."""

    def __init__(self) -> None:
        self.inits = 0
        self.energy_reads: list[int] = []

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.inits -= 1

    def _open(self) -> None:
        if self.inits <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def nvmlDeviceGetCount(self) -> int:
        self._open()
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        self._open()
        return f"gpu{index}"

    def nvmlDeviceGetUUID(self, handle: str) -> str:
        self._open()
        return "GPU-0000"

    def nvmlDeviceGetName(self, handle: str) -> str:
        self._open()
        return "stand-in"

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        self._open()
        return SimpleNamespace(total=80 * 2**30, used=2**30)

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        self._open()
        return SimpleNamespace(gpu=90)

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        self._open()
        return 300_000

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: str) -> int:
        self._open()
        self.energy_reads.append(1_000_000 + 7_000 * len(self.energy_reads))
        return self.energy_reads[-1]


def test_the_energy_counter_is_read_with_the_samples_not_after_nvml_shuts_down(monkeypatch):
    nvml = OneGpuNvml()
    for name in dir(nvml):
        if name.startswith("nvml"):
            monkeypatch.setattr(pynvml, name, getattr(nvml, name))
    sampler = Sampler(os.getpid(), INTERVAL, "0").start()
    time.sleep(4 * INTERVAL)
    sampler.stop()
    assert nvml.inits == 0, "the sampler shut NVML down"
    [device] = sampler.summary()["gpu"]["devices"]
    assert "energy" not in device["unsupported"]
    assert len(nvml.energy_reads) >= 3  # at the start, then with each sample, the last at stop
    first, last = nvml.energy_reads[0], nvml.energy_reads[-1]
    assert device["energy_j"] == (last - first) / 1000


def test_a_step_writes_its_telemetry_file_and_run_record(tmp_path, monkeypatch, capsys):
    out = tmp_path / "record.json"
    runtime = json.dumps({"telemetry": {"interval_s": INTERVAL}})
    assert gpuflow_main(["probe", "--out", str(out), "--hold", "0.3", "--runtime", runtime]) == 0
    telemetry = json.loads(record_path(out).read_text())
    assert telemetry["status"] == "finished"
    assert telemetry["interval_s"] == INTERVAL
    assert telemetry["samples"] >= 3
    assert telemetry["cpu"]["peak_rss_mb"] > 50  # the step imported torch
    assert telemetry["gpu"]["count"] == (nvml_device_count() or 0)
    record = json.loads(out.read_text())
    assert record["telemetry"]["status"] == "running"  # the record is written mid-step
    # the record holds the sampler's figures so far: this machine's cores, and no more CPU time
    # than the whole step's (the first sample only sets the baseline, so it may still be 0)
    cpu, final = record["telemetry"]["cpu"], telemetry["cpu"]
    assert cpu["allotted_cores"] == final["allotted_cores"] == len(os.sched_getaffinity(0))
    assert 0 <= cpu["cpu_seconds"] <= final["cpu_seconds"], (cpu, final)
    assert cpu["util_percent_mean"] == pytest.approx(
        100 * cpu["cores_busy_mean"] / cpu["allotted_cores"]
    )


def test_a_failed_step_records_its_telemetry_too(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,text\n1,fine\n2,\n")
    out = tmp_path / "texts.csv"
    files = {"texts": {"source": "files", "files": [str(bad)], "id_column": "id"}}
    argv = ["fluency-texts", "--settings", json.dumps(files), "--out", str(out)]
    assert gpuflow_main(argv) == 2
    record = json.loads(record_path(out).read_text())
    assert record["status"] == "failed (DataError)"
    assert record["error"].startswith(f"{bad}, row 2:"), "the error's first line, for status"
    assert not out.exists()


def test_a_step_interrupted_by_ctrl_c_is_recorded_stopped_not_failed(tmp_path):
    """Ctrl-C on a local run reaches its jobs too: like a SIGTERM, not the step's failure."""
    out = tmp_path / "out.json"
    with pytest.raises(KeyboardInterrupt), job_record("test", [out], INTERVAL):
        raise KeyboardInterrupt
    record = json.loads(record_path(out).read_text())
    assert record["status"] == "stopped" and "error" not in record


def test_only_rank_0_of_a_torchrun_job_samples(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    with job_record("test", [tmp_path / "out.json"], INTERVAL) as job:
        assert job is None
    assert not record_path(tmp_path / "out.json").exists()


def recorded_job(tmp_path, name: str, wait_s: float, work_s: float, steps: int) -> dict:
    """A real job of `steps` steps that waits `wait_s` for each batch and computes `work_s`,
    noting its measured waiting time and step time as the steps do."""
    out = tmp_path / name
    with job_record("test", [out], INTERVAL):
        waited, started = 0.0, time.perf_counter()
        for _ in range(steps):
            if wait_s:
                mark = time.perf_counter()
                time.sleep(wait_s)
                waited += time.perf_counter() - mark
            end = time.perf_counter() + work_s
            while time.perf_counter() < end:
                pass
        note(data_wait_s=waited, step_s=(time.perf_counter() - started) / steps, batch_size=4)
    return json.loads(record_path(out).read_text())


def test_flags_name_data_loading_or_tiny_batches_from_the_jobs_own_timings(tmp_path):
    loading = recorded_job(tmp_path, "loading", wait_s=0.05, work_s=0.005, steps=10)
    tiny = recorded_job(tmp_path, "tiny", wait_s=0.0, work_s=0.0001, steps=2000)
    assert loading["cpu"]["util_percent_mean"] < 50
    reason = likely_reason(loading)
    assert reason.startswith("data loading (") and "% of the time)" in reason
    assert flag(loading, 50) == f"LOW: {reason}"
    assert flag(loading, 0) == ""
    assert likely_reason(tiny).startswith("tiny batches (batches of 4, ")
    section = jobs_section(tmp_path, 50)
    assert "| loading | finished |" in section
    assert "LOW: data loading" in section
    assert "2 jobs" in section


LOADING = {"cpu": {"util_percent_mean": 10.0}, "wall_s": 1.0, "timings": {"data_wait_s": 0.9}}
TINY = {"cpu": {"util_percent_mean": 10.0}, "wall_s": 1.0, "timings": {"step_s": 0.001}}


def test_a_rule_s_flag_is_its_jobs_most_common_one_and_a_tie_goes_to_the_first_job():
    assert rule_summary([LOADING, TINY, TINY], 50)["flag"].startswith("LOW: tiny batches")
    tie = (
        "from gpuflow.job.record_tables import rule_summary\n"
        f"print(rule_summary([{LOADING!r}, {TINY!r}], 50)['flag'])"
    )
    flags = {  # set order follows the hash seed: the flag must not
        subprocess.run(
            [sys.executable, "-c", tie],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in range(8)
    }
    assert flags == {"LOW: data loading (90% of the time)\n"}


def test_a_job_given_no_gpu_samples_none_though_nvml_may_see_the_nodes():
    assert job_gpus({"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_JOB_ID": "7"}) == "2,3"
    assert job_gpus({}) is None  # by hand on a workstation: every GPU
    assert job_gpus({"SLURM_JOB_ID": "7"}) == ""  # a CPU job on a GPU node
    assert job_gpus({"SLURM_JOB_ID": "7", "SLURM_STEP_GPUS": "0"}) is None
    assert job_gpus({"GPUFLOW_GPUS": "0"}) == ""
