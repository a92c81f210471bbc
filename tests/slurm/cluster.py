"""A real SLURM on loopback, from Debian's packages: the host's node with four fake GPUs, and more.

Used by the SLURM tests (session fixture in tests/slurm/fixtures.py) and by hand:

    python tests/slurm/cluster.py up      # install if missing, write /etc/slurm, start daemons
    python tests/slurm/cluster.py down    # stop the daemons this script started, by pid

Facts it relies on: no systemd, so munged, mariadbd, slurmdbd,
slurmctld and slurmd are started here and stopped by pid; the config must be
/etc/slurm/slurm.conf (the jobstep plugin drops SLURM_CONF); fake GPUs are gres device files,
symlinks to /dev/null; DefMemPerCPU makes jobs share the node. A requeued job waits out the
job credential's lifetime before it starts again (AuthInfo cred_expire, 120 s by default); 10 s
here, so a preemption test does not spend two minutes waiting.

Accounting is a production one: slurmdbd over a MariaDB whose data lives in STATE/mysql (made
fresh by each `up`, as slurmctld's job ids start again at 1), so `sacct` answers, with job
comments (`AccountingStoreFlags=job_comment`) as the profile's status checks and efficiency
report read them. The database listens on 127.0.0.1 only and asks no password
(--skip-grant-tables): a test cluster on loopback, nothing to guard.

Jobs are held to their memory as on a production cluster: task/cgroup with ConstrainRAMSpace
(cgroup v1, which this machine mounts; we are root). A step over its memory is OOM-killed and
ends OUT_OF_MEMORY. Processes are tracked with proctrack/cgroup, as on production clusters
(GPUFLOW_TEST_SLURM_PROCTRACK=linuxproc selects proctrack/linuxproc). By design (SLURM 22.05
proctrack_cgroup.c, proctrack_p_signal) cgroup tracking sends any signal but SIGKILL (requeue,
scancel, time limit, the --signal warning) only to a step's tasks, the direct children of
slurmstepd, and once they have ended slurmstepd SIGKILLs what is left of the step (mgr.c).
A gpuflow step runs as srun -> Snakemake -> bash -> gpuflow: without gpuflow.job.forward as the
task, the training never saw SIGTERM or the warning and ran on until SIGKILL after KillWait
(measured: 29.7 s; a requeued SSVAE training trained epochs 1-26 and saved no stop). linuxproc
signals each step's whole process tree. A process that leaves its job's process tree can
outlive the job under linuxproc: the harness ends a cancelled job's processes by pid, and
`down` ends every process of this cluster's jobs (SLURM_CLUSTER_NAME in its environment).

Three more nodes, each a slurmd in a network namespace of its own (tests/slurm/nodes.py), make
partition 'multi' for jobs that span nodes and partition 'pack', a four-GPU node of its own for
the test that counts how SLURM packs jobs onto one.
A machine that cannot host the cluster at all (`cannot_host`: not root, or neither SLURM nor
apt-get) skips the live-SLURM tests up front, saying so in one line at the end (tests/conftest.py),
or fails the whole session where GPUFLOW_TEST_REQUIRE_SLURM=1 (.ci/run). On a machine that can,
anything that goes wrong raises ClusterError with the daemons' log tails: tests fail, never skip.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

try:
    from tests.slurm import nodes
except ModuleNotFoundError:  # run as a script, `python tests/slurm/cluster.py up`
    import nodes  # type: ignore[no-redef]

PACKAGES = ("slurmctld", "slurmd", "slurmdbd", "slurm-client", "munge", "mariadb-server")
PROGRAMS = ("slurmctld", "slurmd", "slurmdbd", "sbatch", "sacct", "munged", "mariadbd")
CONF_DIR = Path("/etc/slurm")
STATE = Path(os.environ.get("GPUFLOW_TEST_SLURM_STATE", "/tmp/gpuflow-test-slurm"))
MARKER = "# written by gpuflow tests/slurm/cluster.py"
N_GPUS = 4
GPU_TYPE = "testgpu"
CPUS = 16
MEMORY_MB = 32000
# Partitions gpu and cpu: a time limit, as on a production cluster, which tests/slurm/site.yaml
# states (max_runtime: 600) and `gpuflow doctor --profile` checks the site file against.
MAX_TIME = "10:00:00"
MIN_JOB_AGE = 3600  # longer than any test run: checks after a run read every job of it from squeue
CLUSTER = "gpuflowtest"
MULTI_NODE = (4, 8000)  # CPUs, memory MB of each of partition multi's nodes (tests/slurm/nodes.py)
PACK_NODE = (CPUS, MEMORY_MB // 2)  # partition pack's node
DB_PORT = 16306
# A node whose slurmd is silent this long is DOWN and its jobs NODE_FAIL (tests/test_slurm_faults.py
# waits it out); long enough that a slurmd busy on a loaded 2-core machine still answers in time.
SLURMD_TIMEOUT = 30
# proctrack plugin: cgroup (default) or linuxproc (GPUFLOW_TEST_SLURM_PROCTRACK); see above.
PROCTRACKS = ("cgroup", "linuxproc")
DB_SIZES = ("--innodb-buffer-pool-size=32M", "--innodb-log-file-size=8M")
DAEMONS = ("slurmd", "slurmctld", "slurmdbd", "mariadbd", "munged")  # the order `down` stops


class ClusterError(RuntimeError):
    """The test cluster could not be installed, configured or started."""


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)


def installed() -> bool:
    """Whether SLURM's, munge's and MariaDB's programs are all on PATH."""
    return all(shutil.which(p) for p in PROGRAMS)


def cannot_host() -> str | None:
    """Why this machine cannot host the test cluster, or None where it can.

    `up` writes /etc/slurm, starts the daemons as root and makes network namespaces: it needs
    root, and SLURM's programs installed or apt-get to install them. With
    GPUFLOW_TEST_SLURM_RUNNING=1 the tests use a cluster started by hand instead (it must then
    answer: tests/slurm/fixtures.py), and this machine needs neither.
    """
    if os.environ.get("GPUFLOW_TEST_SLURM_RUNNING") == "1":
        return None
    if os.geteuid() != 0:
        return "not root (the cluster's daemons run as root and it writes /etc/slurm)"
    if not installed() and not shutil.which("apt-get"):
        return "SLURM is not installed and there is no apt-get to install it"
    return None


def install() -> None:
    """apt-get the SLURM and munge packages when their programs are missing."""
    if installed():
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise ClusterError(f"SLURM is missing; installing {PACKAGES} needs root and apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        result = _run(command, env=env)
        if result.returncode != 0:
            output = result.stdout[-2000:] + result.stderr[-2000:]
            raise ClusterError(f"{' '.join(command)} failed:\n{output}")


def slurm_conf(host: str) -> str:
    """slurm.conf of the test cluster: the host's node with partitions 'gpu' and 'cpu', and three
    namespaced nodes (tests/slurm/nodes.py) in partitions 'multi' and 'pack'."""
    return f"""{MARKER}
ClusterName={CLUSTER}
SlurmctldHost={host}({nodes.CONTROLLER_ADDR})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
StateSaveLocation={STATE}/ctld
SlurmdSpoolDir={STATE}/slurmd/%n
SlurmctldPidFile={STATE}/slurmctld.pid
SlurmdPidFile={STATE}/slurmd-%n.pid
SlurmctldLogFile={STATE}/slurmctld.log
SlurmdLogFile={STATE}/slurmd-%n.log
ProctrackType=proctrack/{proctrack()}
TaskPlugin=task/cgroup
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
DefMemPerCPU=500
MinJobAge={MIN_JOB_AGE}
SlurmdTimeout={SLURMD_TIMEOUT}
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=2
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment
MpiDefault=none
GresTypes=gpu
NodeName={host} NodeAddr=127.0.0.1 CPUs={CPUS} RealMemory={MEMORY_MB} \
 Gres=gpu:{GPU_TYPE}:{N_GPUS} State=UNKNOWN
PartitionName=gpu Nodes={host} MaxTime={MAX_TIME} State=UP
PartitionName=cpu Nodes={host} Default=YES MaxTime={MAX_TIME} State=UP
{nodes.conf_lines(f"gpu:{GPU_TYPE}:{N_GPUS}", MULTI_NODE, PACK_NODE)}"""


def proctrack() -> str:
    """The test cluster's proctrack plugin: GPUFLOW_TEST_SLURM_PROCTRACK, else cgroup."""
    name = os.environ.get("GPUFLOW_TEST_SLURM_PROCTRACK") or "cgroup"
    if name not in PROCTRACKS:
        raise ClusterError(f"GPUFLOW_TEST_SLURM_PROCTRACK={name!r}: one of {', '.join(PROCTRACKS)}")
    return name


def cgroup_conf() -> str:
    """cgroup.conf: each job's memory is held to what it asked for (cgroup v1), as on a
    production cluster; a job over it is OOM-killed and ends OUT_OF_MEMORY. There is no swap
    here to escape to; cores and devices are not confined (the fake GPUs are /dev/null)."""
    return f"""{MARKER}
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainRAMSpace=yes
ConstrainCores=no
ConstrainDevices=no
"""


def slurmdbd_conf() -> str:
    """slurmdbd.conf: the accounting daemon over the MariaDB of `_start_database`."""
    return f"""{MARKER}
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
PidFile={STATE}/slurmdbd.pid
LogFile={STATE}/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={DB_PORT}
StorageUser=root
StorageLoc=slurm_acct_db
"""


def gres_conf(host: str) -> str:
    """gres.conf: four GPUs whose device files are symlinks to /dev/null."""
    return f"{MARKER}\n" + "".join(
        f"NodeName={name} Name=gpu Type={GPU_TYPE} File={STATE}/dev/nvidia[0-{N_GPUS - 1}]\n"
        for name in (host, *nodes.NAMES)
    )


def _write_config(host: str) -> None:
    CONF_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in _configs(host):
        path = CONF_DIR / name
        if path.exists() and MARKER not in path.read_text(errors="replace"):
            backup = STATE / f"{name}.before-tests"
            if not backup.exists():
                shutil.copy2(path, backup)
        path.write_text(text)
        path.chmod(0o600 if name == "slurmdbd.conf" else 0o644)
    (STATE / "dev").mkdir(parents=True, exist_ok=True)
    for i in range(N_GPUS):
        device = STATE / "dev" / f"nvidia{i}"
        if not device.is_symlink():
            device.symlink_to("/dev/null")
    for folder in ("ctld", "slurmd", "mysql"):
        shutil.rmtree(STATE / folder, ignore_errors=True)
        (STATE / folder).mkdir(parents=True)
    for name in (host, *nodes.NAMES):
        (STATE / "slurmd" / name).mkdir()


def _configs(host: str) -> tuple[tuple[str, str], ...]:
    """The files written to /etc/slurm and their text."""
    return (
        ("slurm.conf", slurm_conf(host)),
        ("gres.conf", gres_conf(host)),
        ("slurmdbd.conf", slurmdbd_conf()),
        ("cgroup.conf", cgroup_conf()),
    )


def _munge_works() -> bool:
    if not shutil.which("munge"):
        return False
    token = _run(["munge", "-n"])
    return token.returncode == 0 and _run(["unmunge"], input=token.stdout).returncode == 0


_STARTED: dict[int, subprocess.Popen] = {}


def _start(command: list[str], name: str) -> int:
    log = open(STATE / f"{name}.out", "ab")  # noqa: SIM115 (the daemon keeps it)
    process = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
    _STARTED[process.pid] = process
    return process.pid


def _tail(name: str, lines: int = 25) -> str:
    text = []
    for suffix in (".log", ".out"):
        path = STATE / f"{name}{suffix}"
        if path.exists():
            text += path.read_text(errors="replace").splitlines()[-lines:]
    return f"--- {name} ---\n" + "\n".join(text)


def _wait_for(check, what: str, timeout: float, logs: tuple[str, ...]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise ClusterError(f"{what} within {timeout:.0f} s\n" + "\n".join(_tail(n) for n in logs))


def _nodes_idle() -> bool:
    state = _run(["sinfo", "-h", "-N", "-o", "%T"])
    return state.returncode == 0 and set(state.stdout.split()) == {"idle"}


def answers() -> bool:
    """A controller answers and the node is up (started by `up`, here or in another session)."""
    return _run(["scontrol", "ping"]).stdout.count("UP") > 0 and _node_idle_or_busy()


def _node_idle_or_busy() -> bool:
    state = _run(["sinfo", "-h", "-o", "%T"]).stdout
    return any(s in state for s in ("idle", "mixed", "allocated"))


def _database_answers() -> bool:
    query = ["mariadb", "--no-defaults", "-h127.0.0.1", f"-P{DB_PORT}", "-uroot", "-e", "select 1"]
    return _run(query).returncode == 0


def _slurmdbd_answers() -> bool:
    return _run(["sacctmgr", "--noheader", "--parsable2", "show", "cluster"]).returncode == 0


def _start_accounting() -> dict[str, int]:
    """A fresh MariaDB in STATE/mysql and slurmdbd over it; their pids."""
    install_db = ["mariadb-install-db", "--no-defaults", f"--datadir={STATE}/mysql"]
    install_db += ["--user=root", "--skip-test-db", *DB_SIZES]
    made = _run(install_db)
    if made.returncode != 0:
        raise ClusterError(
            f"mariadb-install-db failed:\n{made.stdout[-2000:]}{made.stderr[-2000:]}"
        )
    pids = {
        "mariadbd": _start(
            [
                "mariadbd",
                "--no-defaults",
                f"--datadir={STATE}/mysql",
                "--user=root",
                f"--socket={STATE}/mysql.sock",
                f"--pid-file={STATE}/mariadbd.pid",
                f"--log-error={STATE}/mariadbd.log",
                "--bind-address=127.0.0.1",
                f"--port={DB_PORT}",
                "--skip-grant-tables",
                *DB_SIZES,
            ],
            "mariadbd",
        )
    }
    _wait_for(_database_answers, "mariadbd did not answer", 30, ("mariadbd",))
    pids["slurmdbd"] = _start(["slurmdbd", "-D"], "slurmdbd")
    _wait_for(_slurmdbd_answers, "slurmdbd did not answer", 30, ("slurmdbd", "mariadbd"))
    return pids


def up() -> dict[str, int]:
    """Install, configure and start the cluster; return the pids of the daemons started."""
    install()
    STATE.mkdir(parents=True, exist_ok=True)
    down()
    host = socket.gethostname().split(".")[0]
    _write_config(host)
    pids: dict[str, int] = {}
    if not _munge_works():
        run_dir = Path("/run/munge")
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.chown(run_dir, "munge", "munge")
        pids["munged"] = _start(
            ["runuser", "-u", "munge", "--", "/usr/sbin/munged", "--foreground"], "munged"
        )
        _wait_for(_munge_works, "munged did not answer", 15, ("munged",))
    pids.update(_start_accounting())
    nodes.network_up()
    pids["slurmctld"] = _start(["slurmctld", "-D", "-c", "-i"], "slurmctld")
    _wait_for(
        lambda: _run(["scontrol", "ping"]).stdout.count("UP") > 0,
        "slurmctld did not answer",
        30,
        ("slurmctld",),
    )
    pids["slurmd"] = _start(["slurmd", "-D", "-N", host], f"slurmd-{host}")
    for name in nodes.NAMES:
        pids[f"slurmd@{name}"] = _start(nodes.slurmd_command(name), f"slurmd-{name}")
    (STATE / "pids.json").write_text(json.dumps(pids))
    logs = ("slurmctld", *(f"slurmd-{name}" for name in (host, *nodes.NAMES)))
    _wait_for(_nodes_idle, "the nodes did not become idle", 30, logs)
    return pids


def _pids() -> dict[str, int]:
    return json.loads((STATE / "pids.json").read_text())


def stop_daemon(name: str) -> None:
    """Stop the cluster's `slurmctld` (it saves its state: its jobs stay) or the main node's
    `slurmd` (its job steps go on without it, as on a node the controller lost)."""
    pid = _pids()[name]
    if name == "slurmd":
        os.kill(pid, signal.SIGTERM)
        process = _STARTED.pop(pid, None)
        if process is not None:
            process.wait(timeout=30)
        _wait_for(lambda: not _is_ours(pid, name), f"{name} did not stop", 30, ())
    else:
        _stop(pid, name)


def start_daemon(name: str) -> None:
    """Start a daemon `stop_daemon` stopped: slurmctld from its saved state (no -c), the main
    node's slurmd; wait until it answers."""
    host = socket.gethostname().split(".")[0]
    if name == "slurmctld":
        pid = _start(["slurmctld", "-D", "-i"], "slurmctld")
        check = lambda: _run(["scontrol", "ping"]).stdout.count("UP") > 0  # noqa: E731
    else:
        pid = _start(["slurmd", "-D", "-N", host], f"slurmd-{host}")
        check = _node_idle_or_busy
    pids = _pids()
    pids[name] = pid
    (STATE / "pids.json").write_text(json.dumps(pids))
    _wait_for(
        check, f"{name} did not answer", 60, (name if name == "slurmctld" else f"slurmd-{host}",)
    )


def down() -> None:
    """Stop the daemons that `up` started (by the pids it saved); remove our configs.

    Without them, SLURM clients (which every snakemake start asks, through the executor
    plugin) fail at once instead of waiting for a controller that is gone.
    """
    _end_job_processes()
    pid_file = STATE / "pids.json"
    if pid_file.exists():
        pids = json.loads(pid_file.read_text())
        for name in [*(f"slurmd@{node}" for node in nodes.NAMES), *DAEMONS]:
            if name in pids:
                _stop(pids[name], name.split("@")[0])
        pid_file.unlink()
    nodes.network_down()
    for name, _ in _configs(""):
        path, backup = CONF_DIR / name, STATE / f"{name}.before-tests"
        if path.exists() and MARKER in path.read_text(errors="replace"):
            path.unlink()
        if backup.exists():
            shutil.move(backup, path)


def _end_job_processes() -> None:
    """SIGKILL every process a job of this cluster left (its environment names the cluster)."""
    mark = f"SLURM_CLUSTER_NAME={CLUSTER}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if mark in (proc / "environ").read_bytes().split(b"\0"):
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:
            continue


def _is_ours(pid: int, name: str) -> bool:
    """The pid still runs the daemon we started (not a reused pid)."""
    try:
        return name in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def _stop(pid: int, name: str, timeout: float = 10.0) -> None:
    if not _is_ours(pid, name):
        return
    os.killpg(pid, signal.SIGTERM)
    process = _STARTED.pop(pid, None)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            return
        if process is None and not _is_ours(pid, name):
            return
        time.sleep(0.2)
    os.killpg(pid, signal.SIGKILL)
    if process is not None:
        process.wait()


if __name__ == "__main__":
    action = sys.argv[1] if len(sys.argv) > 1 else ""
    if action == "up":
        print(json.dumps(up()))
    elif action == "down":
        down()
    else:
        sys.exit("usage: cluster.py up|down")
