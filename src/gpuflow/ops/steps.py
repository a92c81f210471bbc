"""The operator tools' steps: doctor, plan, status, calibrate, ledger, timeline and more."""

from __future__ import annotations

import argparse

from gpuflow.cost.records import rate_records
from gpuflow.registry import lazy


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Targets, profiles, config files, Snakefile and directory, as Snakemake takes them."""
    parser.add_argument("targets", nargs="*", help="targets (files or rules); default: all")
    parser.add_argument(
        "--profile",
        action="append",
        default=[],
        help="Snakemake profile, e.g. profiles/slurm (repeat to layer profiles, as Snakemake)",
    )
    parser.add_argument("--configfile", nargs="+", default=[], help="config files, as Snakemake")
    parser.add_argument("--snakefile", default=None, help="Snakefile (default: the workflow's)")
    parser.add_argument("--directory", default=".", help="working directory of the workflow")
    parser.add_argument(
        "--persistence-backend",
        choices=("file", "db"),
        default=None,
        help="Snakemake's persistence backend (default: a profile's, else db where the folder"
        " holds .snakemake/metadata.db, else file)",
    )


def add_records_out_argument(parser: argparse.ArgumentParser) -> None:
    """`--out`: the folder a step writes its record into."""
    parser.add_argument(
        "--out", default="benchmarks/records", help="folder of the records (default %(default)s)"
    )


def add_timings_argument(parser: argparse.ArgumentParser) -> None:
    """`--timings` (the records of measured times and rates) and `--gpu` (whose rates)."""
    parser.add_argument(
        "--timings",
        default=str(rate_records()),
        help="the records of measured job times (gpuflow record-timings) and rates (make gpu-check,"
        " gpuflow calibrate) that expected times come from (default: $GPUFLOW_RECORDS, else"
        " benchmarks/records)",
    )
    parser.add_argument(
        "--gpu",
        default=None,
        help="the GPU whose rates plan GPU jobs, a part of its records' names, e.g. h100"
        " (default: the site file's gpu_model, else the newest GPU with records)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the operator tools to the `gpuflow` parser."""
    doctor = subparsers.add_parser(
        "doctor", help="what this machine offers and what the config will use"
    )
    doctor.add_argument(
        "--configfile",
        nargs="+",
        default=["config/config.yaml"],
        help="config files to explain, later ones merged over earlier (as Snakemake does)",
    )
    doctor.add_argument(
        "--profile",
        action="append",
        default=[],
        help="Snakemake profile, e.g. profiles/slurm: check its SLURM site file against the live"
        " cluster (partitions, GPU types, time and memory limits, account)",
    )
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(run=lazy("gpuflow.ops.doctor:main"))

    plan = subparsers.add_parser(
        "plan", help="jobs, GPU-hours and submissions the workflow would need, before running it"
    )
    add_run_arguments(plan)
    plan.add_argument("--gpus-per-node", type=int, default=4, help="GPUs packed on one node")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    add_timings_argument(plan)
    plan.set_defaults(run=lazy("gpuflow.ops.plan:main"))

    status = subparsers.add_parser(
        "status", help="how far a run is and what went wrong (local or SLURM, during or after)"
    )
    add_run_arguments(status)
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    add_timings_argument(status)
    status.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=30.0,
        default=None,
        metavar="SECONDS",
        help="print the status again every SECONDS (default 30), in place on a terminal",
    )
    status.set_defaults(run=lazy("gpuflow.ops.status.main:main"))

    calibrate = subparsers.add_parser(
        "calibrate",
        help="measure the rates the config's jobs need on this machine (about a minute on a"
        " laptop), for gpuflow plan",
    )
    add_run_arguments(calibrate)
    add_records_out_argument(calibrate)
    calibrate.add_argument(
        "--trials", type=int, default=3, help="interleaved trials per rate (default %(default)s)"
    )
    calibrate.set_defaults(run=lazy("gpuflow.ops.calibrate:main", outputs=("out",)))

    ledger = subparsers.add_parser(
        "ledger",
        help="per rule, what a run spent (job records, sacct) against what was planned,"
        " during and after the run",
    )
    add_run_arguments(ledger)
    add_timings_argument(ledger)
    ledger.add_argument("--json", action="store_true", help="print the ledger as JSON")
    ledger.set_defaults(run=lazy("gpuflow.ops.ledger:main"))

    probe = subparsers.add_parser(
        "probe", help="record where this job runs (host, SLURM job, GPUs) as JSON"
    )
    probe.add_argument("--out", required=True, help="JSON file to write")
    probe.add_argument("--hold", type=float, default=0.0, help="seconds to stay running")
    probe.add_argument("--label", default="", help="free text stored in the record")
    probe.add_argument("--seed", type=int, default=0, help="seed of the recorded computation")
    probe.set_defaults(run=lazy("gpuflow.ops.probe:main", outputs=("out",)))

    timings = subparsers.add_parser(
        "record-timings",
        help="keep the run's benchmark times as one committed record, for gpuflow plan elsewhere"
        " (the run's own profile, config files and targets)",
    )
    add_run_arguments(timings)
    add_records_out_argument(timings)
    timings.add_argument(
        "--device",
        default=None,
        help="what the jobs ran on, e.g. 'NVIDIA H100 80GB HBM3' (default: this machine's"
        " devices; name them where you record away from the GPUs, e.g. on a login node)",
    )
    timings.set_defaults(run=lazy("gpuflow.ops.plan:record_timings", outputs=("out",)))

    tables = subparsers.add_parser(
        "report-tables", help="a family's summary CSV tables as one HTML page for the report"
    )
    tables.add_argument("--csv", nargs="+", required=True, help="CSV tables, in page order")
    tables.add_argument("--title", required=True, help="heading of the page")
    tables.add_argument("--out", required=True, help="HTML file to write")
    tables.set_defaults(run=lazy("gpuflow.ops.report_tables:main", outputs=("out",)))

    timeline = subparsers.add_parser(
        "timeline",
        help="the run's jobs over time from their job records, one lane per GPU or CPU slot",
    )
    timeline.add_argument(
        "--results",
        default="results",
        help="folder whose job records to draw (default %(default)s)",
    )
    timeline.add_argument(
        "--rules",
        default=None,
        help="JSON {rule: [regex of an output, ...]} naming each job's rule (the workflow passes"
        " it); without it a bar is named by its step",
    )
    timeline.add_argument("--out", required=True, help="figure to write (PNG, SVG or PDF)")
    timeline.add_argument(
        "--out-table", required=True, help="CSV to write: one row per bar (job, rule, lane, times)"
    )
    timeline.set_defaults(run=lazy("gpuflow.ops.timeline:main", outputs=("out", "out_table")))

    config_doc = subparsers.add_parser(
        "config-doc",
        help="write config/README.md from the schema, the config files and the README template",
    )
    config_doc.add_argument("--out", default=None, help="file to write (default: config/README.md)")
    config_doc.set_defaults(run=lazy("gpuflow.ops.config_doc:main", outputs=("out",)))
