"""`gpuflow plan`: what a run would cost before it is submitted.

Reads the jobs Snakemake would run (its dry run, with the same profile, config files and
targets) and prints per rule: jobs, GPUs per job, expected time per job, GPU-hours requested
(`runtime` of the first attempt) and expected, sbatch submissions (job arrays counted as one
per chunk) and node-hours if jobs are packed `--gpus-per-node` GPUs to a node; then totals, and
why each job would run: its outputs are missing, left incomplete by a killed or failed job (the
part a re-run after a partial failure redoes), changed, or downstream of those.

Expected time per job comes from earlier `benchmark:` files of the same rule (any wildcard
values), scaled by size-like numeric wildcards (SIZE_WILDCARDS) when the job's value differs;
without benchmarks, the rule's `runtime`. Benchmarks measure the machine they ran on.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuflow.errors import GpuflowError

SIZE_WILDCARDS = ("frac", "fraction", "n", "size", "samples", "steps", "epochs", "tokens", "texts")
JOB_HEADER = re.compile(r"^(?:local)?(?:rule|checkpoint) (?P<rule>\S+):$")
FIELD = re.compile(r"^    (?P<key>\w+): (?P<value>.*)$")
LOCAL_HEADER = "localrule "


@dataclass
class Job:
    """One job of the dry run."""

    rule: str
    local: bool
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def resources(self) -> dict[str, str]:
        return split_pairs(self.fields.get("resources", ""))

    @property
    def wildcards(self) -> dict[str, str]:
        return split_pairs(self.fields.get("wildcards", ""))

    @property
    def gpus(self) -> int:
        """GPUs of the whole job: `gpu`, or nodes x --gpus-per-node for multi-node rules."""
        per_node = re.search(r"--gpus-per-node[= ](\d+)", self.resources.get("slurm_extra", ""))
        if per_node:
            return int(float(self.resources.get("nodes", 1) or 1)) * int(per_node[1])
        return int(float(self.resources.get("gpu", 0) or 0))

    @property
    def runtime_h(self) -> float:
        return float(self.resources.get("runtime", 0) or 0) / 60

    @property
    def why(self) -> str:
        """missing / incomplete / changed / downstream.

        The dry run runs with --rerun-incomplete, under which Snakemake reports outputs left
        behind by a killed job as "Forced execution": those count as incomplete.
        """
        reason = self.fields.get("reason", "").lower()
        if "incomplete" in reason or "forced execution" in reason:
            return "incomplete"
        if "missing output" in reason:
            return "missing"
        if reason.startswith("input files updated by another job"):
            return "downstream"
        return "changed"


def split_pairs(text: str) -> dict[str, str]:
    """'a=1, b=x' -> {'a': '1', 'b': 'x'}."""
    pairs = {}
    for item in text.split(", "):
        key, sep, value = item.partition("=")
        if sep:
            pairs[key.strip()] = value.strip()
    return pairs


def parse_dry_run(text: str) -> list[Job]:
    """The jobs printed by `snakemake --dry-run` (one block per job)."""
    jobs: list[Job] = []
    current: Job | None = None
    for line in text.splitlines():
        header = JOB_HEADER.match(line)
        if header:
            current = Job(header["rule"], line.startswith(LOCAL_HEADER))
            jobs.append(current)
            continue
        match = FIELD.match(line) if current is not None else None
        if match:
            current.fields[match["key"]] = match["value"]
        elif current is not None and not line.startswith("    "):
            current = None
    return jobs


def dry_run(args: argparse.Namespace) -> str:
    """Snakemake's dry-run listing for the given profile, config files and targets."""
    command = [sys.executable, "-m", "snakemake", "--dry-run", "--rerun-incomplete"]
    command += ["--directory", args.directory]
    if args.profile:
        command += ["--profile", args.profile]
    if args.snakefile:
        command += ["--snakefile", args.snakefile]
    if args.configfile:
        command += ["--configfile", *args.configfile]
    command += list(args.targets)
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise GpuflowError(f"the dry run failed:\n{(result.stdout + result.stderr)[-3000:]}")
    return result.stdout + result.stderr


LOCALRULES = re.compile(r"^localrules:(?P<names>.*?)(?=^\S|\Z)", re.MULTILINE | re.DOTALL)


def local_rules(snakefile: Path) -> set[str]:
    """Rules declared `localrules:` in the Snakefile and the .smk files beside and below it.

    They run on the submit node, so they cost no sbatch (a dry run does not mark them).
    """
    folder = snakefile.parent
    files = [snakefile, *(p for p in folder.rglob("*.smk") if not is_hidden(p, folder))]
    names: set[str] = set()
    for path in files:
        for block in LOCALRULES.finditer(path.read_text(errors="replace")):
            names |= set(re.findall(r"[A-Za-z_]\w*", block["names"]))
    return names


DEFINITIONS = re.compile(
    r'^\s*(?:include:\s*["\'](?P<include>[^"\']+)["\']|rule\s+(?P<rule>\w+)\s*:)', re.M
)


def rule_order(snakefile: Path) -> list[str]:
    """Rule names in the order the Snakefile defines them, following its `include:`s."""
    names: list[str] = []
    for match in DEFINITIONS.finditer(snakefile.read_text(errors="replace")):
        if match["rule"]:
            names.append(match["rule"])
        elif (snakefile.parent / match["include"]).is_file():
            names.extend(rule_order(snakefile.parent / match["include"]))
    return names


def is_hidden(path: Path, root: Path) -> bool:
    parts = path.relative_to(root).parts
    return any(part.startswith(".") or part in ("results", "node_modules") for part in parts)


def find_snakefile(args: argparse.Namespace) -> Path:
    """The Snakefile Snakemake would use."""
    if args.snakefile:
        return Path(args.snakefile)
    for candidate in ("Snakefile", "workflow/Snakefile", "snakefile", "workflow/snakefile"):
        if (Path(args.directory) / candidate).exists():
            return Path(args.directory) / candidate
    raise GpuflowError(f"no Snakefile in {args.directory} (give --snakefile)")


def profile_arrays(profile: str | None) -> tuple[set[str], int]:
    """Rules the profile submits as job arrays, and the array chunk size."""
    if not profile:
        return set(), 1000
    folder = Path(profile)
    candidates = [folder] if folder.is_file() else sorted(folder.glob("*.yaml"))
    for path in candidates:
        if re.fullmatch(r"(profile|config)(\.v\d+\+)?\.yaml", path.name):
            text = path.read_text()
            settings = profile_settings(text)
            rules = str(settings.get("slurm-array-jobs") or "").replace(";", ",")
            return {r.strip() for r in rules.split(",") if r.strip()}, int(
                settings.get("slurm-array-limit") or 1000
            )
    return set(), 1000


def profile_settings(text: str) -> dict[str, Any]:
    """A profile's settings, rendered through YTE when it uses it (as Snakemake does)."""
    import yte

    return yte.process_yaml(text, require_use_yte=True) or {}


def benchmark_pattern(job: Job) -> tuple[str, re.Pattern[str]] | None:
    """A glob over the rule's benchmark files (any wildcard values) and a regex reading them.

    Wildcards appear as `name~value` (Paramspace style) or as a value found once in the path.
    """
    path = job.fields.get("benchmark")
    if not path:
        return None
    pattern, regex = path, re.escape(path)
    for name, value in job.wildcards.items():
        token = f"{name}~{value}"
        if path.count(token) == 1:
            old, prefix = token, f"{name}~"
        elif value and path.count(value) == 1:
            old, prefix = value, ""
        else:
            continue
        pattern = pattern.replace(old, f"{prefix}*")
        regex = regex.replace(re.escape(old), re.escape(prefix) + f"(?P<{name}>[^/]+)")
    return pattern, re.compile(regex + "$")


def benchmark_seconds(path: Path) -> float | None:
    """Mean wall time (column s) of a benchmark TSV."""
    try:
        with open(path, newline="") as handle:
            values = [float(row["s"]) for row in csv.DictReader(handle, delimiter="\t")]
    except (OSError, KeyError, ValueError):
        return None
    return sum(values) / len(values) if values else None


def size_of(wildcards: dict[str, str]) -> float:
    """Product of the size-like numeric wildcards (1 when there are none)."""
    size = 1.0
    for name, value in wildcards.items():
        if name.lower() in SIZE_WILDCARDS:
            try:
                size *= float(value)
            except ValueError:
                continue
    return size


class Benchmarks:
    """Earlier benchmark files per rule, read once."""

    def __init__(self, directory: str):
        self.directory = Path(directory)
        self.cache: dict[str, list[tuple[float, float]]] = {}

    def samples(self, job: Job) -> list[tuple[float, float]]:
        """(seconds, size) of every earlier benchmark of the job's rule."""
        if job.rule not in self.cache:
            found = []
            pattern = benchmark_pattern(job)
            if pattern is not None:
                glob_pattern, regex = pattern
                for name in glob.glob(str(self.directory / glob_pattern)):
                    relative = os.path.relpath(name, self.directory)
                    seconds = benchmark_seconds(Path(name))
                    match = regex.match(relative)
                    if seconds is not None and match:
                        found.append((seconds, size_of(match.groupdict())))
            self.cache[job.rule] = found
        return self.cache[job.rule]

    def expected_hours(self, job: Job) -> tuple[float, bool]:
        """Expected hours of a job and whether benchmarks gave it (else its runtime)."""
        samples = self.samples(job)
        if not samples:
            return job.runtime_h, False
        size = size_of(job.wildcards)
        scaled = [seconds * size / bench_size for seconds, bench_size in samples if bench_size]
        return sum(scaled) / len(scaled) / 3600, True


def summarise(
    jobs: list[Job], benchmarks: Benchmarks, arrays: set[str], array_limit: int, per_node: int
) -> list[dict[str, Any]]:
    """One row per rule with counts, hours and submissions."""
    rows: dict[str, dict[str, Any]] = {}
    for job in jobs:
        if job.rule == "all" and not job.fields.get("output"):
            continue
        row = rows.setdefault(
            job.rule,
            {
                "rule": job.rule,
                "jobs": 0,
                "local": job.local,
                "gpus_per_job": set(),
                "expected_h": 0.0,
                "from_benchmarks": False,
                "gpu_h_requested": 0.0,
                "gpu_h_expected": 0.0,
                "why": {},
            },
        )
        hours, measured = benchmarks.expected_hours(job)
        row["jobs"] += 1
        row["gpus_per_job"].add(job.gpus)
        row["expected_h"] += hours
        row["from_benchmarks"] |= measured
        row["gpu_h_requested"] += job.gpus * job.runtime_h
        row["gpu_h_expected"] += job.gpus * hours
        row["why"][job.why] = row["why"].get(job.why, 0) + 1
    for row in rows.values():
        n = row["jobs"]
        row["expected_h_per_job"] = row.pop("expected_h") / n
        row["gpus_per_job"] = "/".join(str(g) for g in sorted(row["gpus_per_job"]))
        row["sbatch"] = (
            0
            if row["local"]
            else math.ceil(n / array_limit)
            if row["rule"] in arrays and n > 1
            else n
        )
        row["node_h"] = row["gpu_h_expected"] / per_node
    return list(rows.values())


def hours(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def duration(value_h: float) -> str:
    minutes = value_h * 60
    return f"{minutes:.1f} min" if minutes < 120 else f"{value_h:.1f} h"


def render(rows: list[dict[str, Any]], per_node: int, seconds: float) -> str:
    """The plan as a table with totals and the re-run summary."""
    header = (
        f"{'rule':<28} {'jobs':>5} {'GPUs':>5} {'time/job':>14} {'GPU-h req':>10} "
        f"{'GPU-h exp':>10} {'sbatch':>7} {'node-h':>8}  why"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        source = "bench" if row["from_benchmarks"] else "runtime"
        why = ", ".join(f"{k} {v}" for k, v in sorted(row["why"].items()))
        lines.append(
            f"{row['rule']:<28} {row['jobs']:>5} {row['gpus_per_job']:>5} "
            f"{duration(row['expected_h_per_job']) + ' ' + source[0]:>14} "
            f"{hours(row['gpu_h_requested']):>10} {hours(row['gpu_h_expected']):>10} "
            f"{row['sbatch']:>7} {hours(row['node_h']):>8}  {why}"
        )
    total = {
        key: sum(row[key] for row in rows)
        for key in ("jobs", "gpu_h_requested", "gpu_h_expected", "sbatch", "node_h")
    }
    lines += [
        "-" * len(header),
        f"{'total':<28} {total['jobs']:>5} {'':>5} {'':>14} "
        f"{hours(total['gpu_h_requested']):>10} {hours(total['gpu_h_expected']):>10} "
        f"{total['sbatch']:>7} {hours(total['node_h']):>8}",
        "",
        "time/job: b = mean of earlier benchmark files of the rule (scaled by size wildcards),",
        "r = the rule's runtime (first attempt). GPU-h req = GPUs x runtime; node-h = expected",
        f"GPU-hours / {per_node} GPUs per node. sbatch: job arrays count once per chunk.",
    ]
    resume = sum(row["why"].get(k, 0) for row in rows for k in ("missing", "incomplete"))
    incomplete = sum(row["why"].get("incomplete", 0) for row in rows)
    lines.append(
        f"Re-run after a partial failure: {resume} jobs lack their outputs "
        f"({incomplete} left incomplete); the rest run because their inputs will change. "
        f"Plan made in {seconds:.1f} s."
    )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> None:
    """Print the plan (a table, or JSON with --json)."""
    started = time.monotonic()
    jobs = parse_dry_run(dry_run(args))
    snakefile = find_snakefile(args)
    local = local_rules(snakefile)
    for job in jobs:
        job.local = job.local or job.rule in local
    arrays, array_limit = profile_arrays(args.profile)
    rows = summarise(jobs, Benchmarks(args.directory), arrays, array_limit, args.gpus_per_node)
    order = {name: index for index, name in enumerate(rule_order(snakefile))}
    rows.sort(key=lambda row: (order.get(row["rule"], len(order)), row["rule"]))
    placement = perplexity_placement(args)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(render(rows, args.gpus_per_node, time.monotonic() - started))
        if placement:
            print(f"Perplexity placement: {placement}")


def perplexity_placement(args: argparse.Namespace) -> str | None:
    """How the perplexity jobs will hold the reference LM, when the fluency family is on.

    Imported here: the placement module needs torch, which the rest of the plan does not.
    """
    from gpuflow.config import load_config
    from gpuflow.fluency.placement import fluency_placement

    default = find_snakefile(args).parent / "config" / "config.yaml"
    if not default.is_file():  # not gpuflow's workflow (e.g. the tests' probe workflow)
        return None
    config = load_config(default, *args.configfile)
    if "fluency" not in config["families"]:
        return None
    return fluency_placement(config["fluency"])
