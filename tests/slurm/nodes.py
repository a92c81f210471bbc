"""Three more nodes for the test cluster, each a slurmd in a network namespace of its own.

Each node has its own address on a bridge (NODE_SUBNET.11, .12, .13; the host is .1, where slurmctld
is reached from everywhere), its own hostname (a UTS namespace: torch's rendezvous and gloo find
their node by it) and a line in /etc/hosts, so srun, torchrun's c10d rendezvous and gloo talk
over a network between hosts as on a real cluster. The file system, munge's socket and the
cgroups are the machine's (slurmd -N keeps each node's cgroups apart). Partition 'multi' holds
two of them, for jobs that span nodes; partition 'pack' the third, for the test that counts how
SLURM packs one-GPU jobs onto a four-GPU node (its GPUs free while other tests use the host's
node); the other partitions stay on the host's node.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

MULTI = ("gfnode1", "gfnode2")
PACK = "gfpack"
NAMES = (*MULTI, PACK)
BRIDGE = "gfbr0"
NODE_SUBNET = "10.77.0"
CONTROLLER_ADDR = f"{NODE_SUBNET}.1"
HOSTS = Path("/etc/hosts")
HOSTS_MARK = "# gpuflow test node"


def address(name: str) -> str:
    """The node's address on the bridge."""
    return f"{NODE_SUBNET}.{11 + NAMES.index(name)}"


def namespace(name: str) -> str:
    """The node's network namespace."""
    return f"gf-{name}"


def conf_lines(gres: str, multi: tuple[int, int], pack: tuple[int, int]) -> str:
    """slurm.conf's lines for the nodes, each with `gres` and (CPUs, memory MB), and their
    partitions 'multi' and 'pack'."""
    sizes = {**dict.fromkeys(MULTI, multi), PACK: pack}
    nodes = "".join(
        f"NodeName={name} NodeAddr={address(name)} CPUs={sizes[name][0]}"
        f" RealMemory={sizes[name][1]} Gres={gres} State=UNKNOWN\n"
        for name in NAMES
    )
    return nodes + (
        f"PartitionName=multi Nodes={','.join(MULTI)} MaxTime=INFINITE State=UP\n"
        f"PartitionName=pack Nodes={PACK} MaxTime=INFINITE State=UP\n"
    )


def slurmd_command(name: str) -> list[str]:
    """slurmd of node `name`, in its network namespace with its hostname (one pid throughout:
    each program execs the next). nsenter, not `ip netns exec`: that also mounts a fresh /sys,
    without the cgroup file systems that proctrack/cgroup needs."""
    inner = f"hostname {name} && exec slurmd -D -N {name}"
    netns = f"--net=/run/netns/{namespace(name)}"
    return ["nsenter", netns, "unshare", "--uts", "sh", "-c", inner]


def network_up() -> None:
    """The bridge, one namespace per node with a veth into the bridge, and /etc/hosts lines."""
    network_down()
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{CONTROLLER_ADDR}/24", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    for number, name in enumerate(NAMES, start=1):
        ns, veth = namespace(name), f"gfveth{number}"
        _ip("netns", "add", ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", veth, "master", BRIDGE, "up")
        _ip("-n", ns, "addr", "add", f"{address(name)}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
    lines = "".join(f"{address(name)} {name} {HOSTS_MARK}\n" for name in NAMES)
    HOSTS.write_text(_hosts_without_ours() + lines)


def network_down() -> None:
    """Remove what network_up made (whatever of it is there)."""
    for name in NAMES:
        subprocess.run(["ip", "netns", "del", namespace(name)], capture_output=True, check=False)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)
    if HOSTS.exists():
        HOSTS.write_text(_hosts_without_ours())


def _hosts_without_ours() -> str:
    kept = [line for line in HOSTS.read_text().splitlines(keepends=True) if HOSTS_MARK not in line]
    return "".join(kept)


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
