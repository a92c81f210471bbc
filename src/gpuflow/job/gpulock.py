"""Distinct GPUs for jobs that share one machine: a lock file per device."""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from gpuflow.errors import GpuflowError

LOCK_DIR_ENV = "GPUFLOW_GPU_LOCK_DIR"
GPUS_ENV = "GPUFLOW_GPUS"
DEVICES_ENV = "GPUFLOW_GPU_DEVICES"
LOCKED_ENV = "GPUFLOW_GPU_LOCKED"
LOCK_JOB_ENV = "GPUFLOW_GPU_LOCK_JOB"
TIMEOUT_ENV = "GPUFLOW_GPU_LOCK_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0
POLL_SECONDS = 0.5
NOTICE_SECONDS = 60.0


def device_pool(environ: dict[str, str] | None = None) -> list[str]:
    """Device ids to share out: GPUFLOW_GPU_DEVICES, else CUDA_VISIBLE_DEVICES, else nvidia-smi."""
    env = os.environ if environ is None else environ
    for name in (DEVICES_ENV, "CUDA_VISIBLE_DEVICES"):
        value = env.get(name, "").strip()
        if value:
            return [d.strip() for d in value.split(",") if d.strip()]
    if shutil.which("nvidia-smi"):
        listing = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        )
        return [line.strip() for line in listing.stdout.splitlines() if line.strip()]
    return []


def _try_lock(lock_dir: Path, device: str) -> IO[bytes] | None:
    handle = open(lock_dir / f"gpu{device}.lock", "a+b")  # noqa: SIM115 (held while the job runs)
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n".encode())
    handle.flush()
    return handle


def acquire(
    n_gpus: int, lock_dir: str | Path, pool: list[str], timeout: float | None = None
) -> tuple[list[str], list[IO[bytes]]]:
    """Lock `n_gpus` free devices of `pool` (waiting while others hold them): (ids, handles)."""
    if n_gpus > len(pool):
        raise GpuflowError(
            f"this job asks for {n_gpus} GPUs but only {len(pool)} are shared out "
            f"({DEVICES_ENV} / CUDA_VISIBLE_DEVICES: {','.join(pool) or 'none'})"
        )
    folder = Path(lock_dir)
    folder.mkdir(parents=True, exist_ok=True)
    started = last_notice = time.monotonic()
    while True:
        held: list[tuple[str, IO[bytes]]] = []
        for device in pool:
            handle = _try_lock(folder, device)
            if handle is not None:
                held.append((device, handle))
                if len(held) == n_gpus:
                    return [d for d, _ in held], [h for _, h in held]
        for _, handle in held:
            handle.close()
        now = time.monotonic()
        if timeout is not None and now - started > timeout:
            raise GpuflowError(
                f"no {n_gpus} free GPU(s) in {folder} after waiting {timeout:.0f} s"
                f" (held by: {holders(folder, pool)}); stop those processes, or set"
                f" {TIMEOUT_ENV} to wait longer"
            )
        if now - last_notice > NOTICE_SECONDS:
            print(f"gpuflow: waiting for {n_gpus} free GPUs in {folder}", file=sys.stderr)
            last_notice = now
        time.sleep(POLL_SECONDS)


def holders(folder: Path, pool: list[str]) -> str:
    """'gpu<id> pid <pid>' for each device lock file of `pool` that names a holder."""
    found = []
    for device in pool:
        path = folder / f"gpu{device}.lock"
        pid = path.read_text(errors="replace").strip() if path.is_file() else ""
        if pid:
            found.append(f"gpu{device} pid {pid}")
    return ", ".join(found) or "unknown processes"


def locking_applies(environ: dict[str, str] | None = None) -> bool:
    """Whether this process shares devices by lock files (docs/recovery.md)."""
    env = os.environ if environ is None else environ
    if not env.get(LOCK_DIR_ENV) or env.get(LOCKED_ENV):
        return False
    slurm_job = env.get("SLURM_JOB_ID")
    return slurm_job is None or slurm_job == env.get(LOCK_JOB_ENV)


def lock_timeout() -> float:
    """Seconds to wait for free devices: GPUFLOW_GPU_LOCK_TIMEOUT, else DEFAULT_TIMEOUT_S."""
    value = os.environ.get(TIMEOUT_ENV, "").strip()
    if not value:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        raise GpuflowError(f"{TIMEOUT_ENV}={value!r} is not a number of seconds") from None
    if not seconds > 0:
        raise GpuflowError(f"{TIMEOUT_ENV}={value!r} must be a positive number of seconds")
    return seconds


def requested_gpus(environ: dict[str, str] | None = None) -> int:
    """GPUs this process must lock: GPUFLOW_GPUS where locking applies and none is held yet."""
    env = os.environ if environ is None else environ
    if not locking_applies(env):
        return 0
    value = env.get(GPUS_ENV, "0").strip() or "0"
    try:
        n_gpus = int(value)
    except ValueError:
        raise GpuflowError(f"{GPUS_ENV}={value!r} is not a number of GPUs") from None
    if n_gpus < 0:
        raise GpuflowError(f"{GPUS_ENV}={value!r} must not be negative")
    return n_gpus


@contextmanager
def gpus_for_this_process() -> Iterator[list[str]]:
    """Take the device locks this process needs (docs/recovery.md) and expose only those devices."""
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    n_gpus = requested_gpus()
    if n_gpus == 0:
        if locking_applies():
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        yield []
        return
    pool = device_pool()
    devices, handles = acquire(n_gpus, os.environ[LOCK_DIR_ENV], pool, lock_timeout())
    os.environ[DEVICES_ENV] = ",".join(pool)
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    os.environ[LOCKED_ENV] = "1"
    for handle in handles:
        os.set_inheritable(handle.fileno(), True)
    try:
        yield devices
    finally:
        for handle in handles:
            handle.close()


def with_gpus_main(args: argparse.Namespace) -> None:
    """`gpuflow with-gpus -- CMD ...`: run CMD in this process's place, keeping its GPU locks."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise GpuflowError("no command given (use: gpuflow with-gpus -- CMD ...)")
    sys.stdout.flush()
    os.execvp(command[0], command)
