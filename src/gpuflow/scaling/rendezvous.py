"""The rendezvous of a run on several nodes: its head node and a port found free there, per job."""

from __future__ import annotations

import errno
import os
import socket
import sys

FIRST_PORT = 29500
PORTS = 3000  # 29500-32499
JOB_ENV = "SLURM_JOB_ID"
NODE_ENV = "SLURMD_NODENAME"  # kept by the jobstep executor, which drops SLURM_* but the job id
ENDPOINT_ENV = "GPUFLOW_RENDEZVOUS"  # the endpoint, for run.json (the rule sets it for srun)


class NoFreePort(RuntimeError):
    """No port of the range binds on this node."""


def first_port(job_id: int) -> int:
    """Where the port search starts for job `job_id` (neighbouring ids differ)."""
    return FIRST_PORT + job_id % PORTS


def candidates(job_id: int) -> list[int]:
    """Every port of the range, from `first_port(job_id)` on, wrapping round."""
    start = job_id % PORTS
    return [FIRST_PORT + (start + step) % PORTS for step in range(PORTS)]


def binds(port: int) -> bool:
    """Whether `port` is free on this node on every address, as torchrun's store will bind."""
    families = [(socket.AF_INET, "0.0.0.0")]
    if socket.has_ipv6:
        families.append((socket.AF_INET6, "::"))
    for family, anywhere in families:
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no such family on this node
        with probe:
            try:
                probe.bind((anywhere, port))
            except OSError as error:
                if error.errno == errno.EADDRNOTAVAIL:
                    continue  # the family exists but has no address here
                return False
    return True


def free_port(job_id: int) -> int:
    """The first port that binds on this node, searching from `first_port(job_id)`."""
    for port in candidates(job_id):
        if binds(port):
            return port
    last = FIRST_PORT + PORTS - 1
    raise NoFreePort(f"no free port in {FIRST_PORT}-{last} on {head_node()}")


def job_id() -> int:
    """This SLURM job's id (0 outside SLURM)."""
    text = os.environ.get(JOB_ENV, "")
    return int(text) if text.isdigit() else 0


def head_node() -> str:
    """This node as SLURM names it (its hostname outside SLURM)."""
    return os.environ.get(NODE_ENV) or socket.gethostname()


def main() -> int:
    """Print `<head>:<port>`; say on stderr what was chosen, or why nothing could be."""
    job = job_id()
    try:
        port = free_port(job)
    except NoFreePort as error:
        print(f"gpuflow rendezvous: error: {error}", file=sys.stderr)
        return 2
    head = head_node()
    print(
        f"gpuflow rendezvous: {head}:{port} (free on {head}; SLURM job {job} searched from"
        f" {first_port(job)})",
        file=sys.stderr,
    )
    print(f"{head}:{port}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
