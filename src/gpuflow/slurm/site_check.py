"""The site file against the live cluster (`gpuflow doctor --profile profiles/slurm`)."""

from __future__ import annotations

import getpass
import math
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

TIMEOUT_S = 30
FIELD = re.compile(r"(\w+)=(\S*)")


@dataclass
class Node:
    """What scontrol says of one node."""

    name: str
    partitions: set[str]
    memory_mb: int  # RealMemory
    gres: str  # e.g. gpu:a100:4(S:0-1)


@dataclass
class Cluster:
    """Each partition's MaxTime, the nodes, and the user's accounts (None: no accounting)."""

    max_times: dict[str, str]
    nodes: list[Node]
    accounts: set[str] | None
    accounting_error: str = ""

    def nodes_of(self, partition: str) -> list[Node]:
        return [node for node in self.nodes if partition in node.partitions]


class ClusterUnreachable(Exception):
    """SLURM's commands are missing or the controller does not answer."""


def run_command(command: list[str]) -> subprocess.CompletedProcess[str]:
    """A SLURM command's result; a failed start or a timeout as a failed result (status 1)."""
    try:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return subprocess.CompletedProcess(command, 1, "", str(error))


def _records(kind: str) -> list[dict[str, str]]:
    """Each `scontrol show <kind>` record as its key=value fields."""
    done = run_command(["scontrol", "show", kind, "--oneliner"])
    if done.returncode != 0:
        why = (done.stderr.strip() or done.stdout.strip() or "failed").splitlines()[-1]
        raise ClusterUnreachable(f"scontrol show {kind}: {why}")
    return [dict(FIELD.findall(line)) for line in done.stdout.splitlines() if "=" in line]


def minutes(max_time: str) -> float:
    """scontrol's time limit in minutes; infinite where it is UNLIMITED."""
    if max_time.upper() in ("UNLIMITED", "INFINITE"):
        return math.inf
    days, _, clock = max_time.rpartition("-")
    parts = [int(part) for part in clock.split(":")]
    if days or len(parts) == 3:  # [days-]hours[:minutes[:seconds]]
        hours, mins, secs = [*parts, 0, 0][:3]
    else:  # minutes[:seconds]
        hours, mins, secs = 0, parts[0], parts[1] if len(parts) > 1 else 0
    return int(days or 0) * 1440 + hours * 60 + mins + secs / 60


def gpu_types(gres: str) -> set[str]:
    """The GPU types in a node's Gres (an untyped `gpu:4` has none)."""
    entries = re.sub(r"\([^)]*\)", "", gres).split(",")
    return {parts[1] for parts in (e.strip().split(":") for e in entries) if len(parts) == 3}


def read_cluster() -> Cluster:
    """Ask the cluster; ClusterUnreachable where scontrol is missing or gets no answer."""
    if shutil.which("scontrol") is None:
        raise ClusterUnreachable("scontrol: not found (no SLURM client on this machine)")
    max_times = {r["PartitionName"]: r.get("MaxTime", "") for r in _records("partition")}
    nodes = [
        Node(
            r.get("NodeName", ""),
            set(r.get("Partitions", "").split(",")),
            int(r.get("RealMemory", "0")),
            r.get("Gres", "(null)"),
        )
        for r in _records("node")
    ]
    user = getpass.getuser()
    assoc = run_command(["sacctmgr", "-nP", "show", "assoc", f"user={user}", "format=Account"])
    if assoc.returncode != 0:
        why = (assoc.stderr.strip() or "failed").splitlines()[-1]
        return Cluster(max_times, nodes, None, f"sacctmgr: {why}")
    return Cluster(max_times, nodes, set(assoc.stdout.split()))


def mismatches(site: dict[str, Any], cluster: Cluster) -> list[str]:
    """Each value of the site file the cluster does not have, one line each."""
    lines: list[str] = []
    partitions = site.get("partitions") or {}
    for name, limits in partitions.items():
        if name not in cluster.max_times:
            known = ", ".join(sorted(cluster.max_times))
            lines.append(f"partitions.{name}: no such partition on the cluster (it has {known})")
        else:
            lines += _partition_mismatches(name, limits or {}, cluster)
    model = site.get("gpu_model")
    for name, limits in partitions.items():
        nodes = cluster.nodes_of(name)
        gpu_partition = bool((limits or {}).get("max_gpu")) and bool(nodes)
        if model and gpu_partition and all(str(model) not in gpu_types(n.gres) for n in nodes):
            lines.append(
                f"gpu_model: {model} is on no node of GPU partition {name} "
                f"(its GPUs: {_gres(nodes)}): sbatch refuses its GPU jobs"
            )
    account = site.get("account")
    if account and cluster.accounts is not None and str(account) not in cluster.accounts:
        have = ", ".join(sorted(cluster.accounts)) or "none"
        lines.append(
            f"account: {account!r} is not one of user {getpass.getuser()}'s accounts in "
            f"SLURM's database (sacctmgr show assoc: {have})"
        )
    return lines


def _partition_mismatches(name: str, limits: dict[str, Any], cluster: Cluster) -> list[str]:
    """One partition's time and memory limits and GPU types against the partition's own."""
    key, nodes, max_time = f"partitions.{name}", cluster.nodes_of(name), cluster.max_times[name]
    lines = []
    runtime = limits.get("max_runtime")
    if runtime is not None and runtime > minutes(max_time):
        lines.append(
            f"{key}.max_runtime: {runtime} minutes, above the partition's MaxTime of "
            f"{minutes(max_time):g} minutes ({max_time})"
        )
    memory = limits.get("max_mem_mb")
    biggest = max(nodes, key=lambda node: node.memory_mb, default=None)
    if memory is not None and biggest is not None and memory > biggest.memory_mb:
        lines.append(
            f"{key}.max_mem_mb: {memory}, above the memory of the partition's largest node, "
            f"{biggest.memory_mb} MB ({biggest.name}: RealMemory)"
        )
    types = set().union(*(gpu_types(node.gres) for node in nodes))
    for model in limits.get("available_gpu_models") or []:
        if str(model) not in types:
            lines.append(
                f"{key}.available_gpu_models: {model} is on no node of the partition "
                f"(its GPUs: {_gres(nodes)})"
            )
    return lines


def _gres(nodes: list[Node]) -> str:
    """The distinct GPU Gres of `nodes`, e.g. `gpu:testgpu:4`; `none` where they have none."""
    return ", ".join(sorted({node.gres for node in nodes if "gpu" in node.gres})) or "none"


def unchecked(site: dict[str, Any], cluster: Cluster) -> list[str]:
    """The site's account, where the cluster keeps no accounts to check it against."""
    if site.get("account") and cluster.accounts is None:
        return [f"account: not checked ({cluster.accounting_error})"]
    return []
