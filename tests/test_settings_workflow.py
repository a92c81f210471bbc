"""Two kinds of setting, seen from Snakemake: after a finished run of every family, a change of
any runtime-only key (those the schema marks, and those held here that it must keep marking so)
plans no job, a change of a results key re-plans exactly the jobs that use it, and a forced sweep
shard computes its seeds again.

One finished tiny run is shared by every check; each check is a dry run against it.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuflow.job.paths import RECORD, STATE, job_file, job_of
from gpuflow.ops.plan import plan_jobs
from gpuflow.settings.blocks import applies, family_schema, keys_of_kind
from gpuflow.settings.resources import PER_GPU, PER_TASK, cpus_key
from gpuflow.settings.validate import merge_config, schema_families, validate_config
from tests.conftest import REPO, job_counts, snakemake, tiny_config

pytestmark = pytest.mark.workflow

FAMILIES = schema_families()
TINY = tiny_config("all")


# Keys that say where, with what and in what pieces a step runs, never what it computes: no
# schema may re-mark one `x-affects: results` (`*`: any entry of a named block).
MUST_STAY_RUNTIME = {
    "fluency": [
        "device", "cpu_workers", "perplexity.token_budget", "perplexity.fill_free_memory",
        "perplexity.chunk_tokens", "perplexity.placement", "toxicity.batch_size",
        "toxicity.chunk_texts",
    ],
    "ssvae": [
        "train.device", "train.gpu_ids", "train.no_multi_gpu", "train.eval_batch_size",
        "train.data_on_device", "train.num_workers", "train.pin_memory",
        "train.persistent_workers",
    ],
    "scaling": [
        "device", "cpu_threads_per_process", "max_restarts", "multinode.port",
        "baseline.slurm_partition", "configurations.*.train.eval_batch_size",
        "configurations.*.train.num_workers",
    ],
    "sweep": ["device", "cpu_workers"],
    "telemetry": ["interval_s", "tracker", "tracker_folder"],
}  # fmt: skip
RESOURCE_KEYS = ("gpu", "cpus_per_task", "cpus_per_gpu", "mem_mb", "runtime")  # of every rule


def must_stay_runtime(family: str) -> list[tuple[str, ...]]:
    """The part's keys in MUST_STAY_RUNTIME, and for a family every resource of each rule."""
    held = [tuple(key.split(".")) for key in MUST_STAY_RUNTIME[family]]
    if family not in FAMILIES:
        return held
    rules = family_schema(family)["properties"]["resources"]["properties"]
    return held + [("resources", rule, key) for rule in rules for key in RESOURCE_KEYS]


def runtime_keys(family: str) -> list[tuple[str, ...]]:
    """The family's runtime-only keys: those its schema marks and those that must stay so."""
    return sorted(
        set(keys_of_kind(family_schema(family), "runtime")) | set(must_stay_runtime(family))
    )


@pytest.fixture(scope="module")
def finished(finished_all: Path) -> Path:
    """The session's finished run of every family; checks dry-run against it and leave it so."""
    return finished_all


def effective_config(config: dict[str, Any] = TINY) -> dict[str, Any]:
    """The config the workflow sees in a test's working directory: `config` over the schema's
    defaults (the folder has no config/config.yaml of its own to read)."""
    effective = copy.deepcopy(config)
    validate_config(effective)
    return effective


def other_value(schema: dict[str, Any], value: Any) -> Any:
    """A valid value of `schema` that differs from `value`."""
    if "enum" in schema:
        return next(v for v in schema["enum"] if v != value)
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    if value is None:
        if "integer" in kinds:
            return max(1, schema.get("minimum", 1))
        if "string" in kinds:
            return "elsewhere"
        return [0]
    if isinstance(value, bool):
        return not value
    if isinstance(value, list):
        return [*value, other_value(schema["items"], None)]
    if isinstance(value, int):
        below = schema.get("exclusiveMaximum")  # e.g. a share in [0, 1): halfway there
        if below is not None and value + 1 >= below:
            return (value + below) / 2
        maximum = schema.get("maximum")
        return value + 1 if maximum is None or value < maximum else value - 1
    if isinstance(value, float):
        return value / 2
    return f"{value}-other"


def leaf_schema(family: str, path: tuple[str, ...]) -> dict[str, Any]:
    node = family_schema(family)
    for name in path:
        node = node["additionalProperties"] if name == "*" else node["properties"][name]
    return node


def expand_names(path: tuple[str, ...], values: dict[str, Any]) -> list[tuple[str, ...]]:
    """`path` with each `*` replaced by every name present in `values` at that level."""
    if not path:
        return [()]
    head, rest = path[0], path[1:]
    names = sorted(values) if head == "*" else [head]
    return [
        (name, *tail)
        for name in names
        for tail in expand_names(rest, values.get(name, {}) if rest else {})
    ]


def changed_cores_key(family: str, config: dict[str, Any], rule: str) -> str:
    """The key that holds a rule's cores once its `gpu`, a runtime key too, is changed: a CPU
    rule becomes a GPU rule (cpus_per_gpu) and the other way round (cpus_per_task)."""
    block = config[family]["resources"][rule]
    gpu = other_value(leaf_schema(family, ("resources", rule, "gpu")), block["gpu"])
    return cpus_key({**block, "gpu": gpu})


def runtime_overrides(family: str, config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Every runtime-only key of the family set to another valid value, and the keys' names."""
    overrides: dict[str, Any] = {}
    names = []
    for pattern in runtime_keys(family):
        for path in expand_names(pattern, config[family]):
            cores = path[0] == "resources" and path[-1] in (PER_GPU, PER_TASK)
            if cores and path[-1] != changed_cores_key(family, config, path[1]):
                continue  # a rule's cores are under its own kind's key alone
            parent = config[family]
            for name in path[:-1]:
                parent = parent[name]
            # a rule's cores: its count now, under either key, so that the change is a real one
            current = parent.get(PER_GPU, parent.get(PER_TASK)) if cores else parent.get(path[-1])
            value = other_value(leaf_schema(family, pattern), current)
            assert value != current
            node = overrides
            for name in path[:-1]:
                node = node.setdefault(name, {})
            node[path[-1]] = value
            names.append(".".join((family, *path)))
    return {family: overrides}, names


def unread_overrides(
    schema: dict[str, Any], values: dict[str, Any], path: tuple[str, ...] = ()
) -> tuple[dict[str, Any], list[str]]:
    """Every leaf key the configured choices do not read (its `x-applies-when` fails on the
    values of its siblings) set to another valid value, and the keys' dotted names."""
    overrides: dict[str, Any] = {}
    names = []
    for name, value in values.items():
        child = schema.get("properties", {}).get(name, schema.get("additionalProperties"))
        if not isinstance(child, dict):
            continue
        if isinstance(value, dict) and not applies(child, values, schema):
            raise AssertionError(f"{'.'.join((*path, name))}: a whole block marked unread")
        if isinstance(value, dict):
            part, part_names = unread_overrides(child, value, (*path, name))
            if part:
                overrides[name] = part
                names += part_names
        elif not applies(child, values, schema):
            overrides[name] = other_value(child, value)
            names.append(".".join((*path, name)))
    return overrides, names


@pytest.mark.parametrize("family", [*FAMILIES, "telemetry"])
def test_the_schema_marks_runtime_only_every_key_that_must_stay_so(family):
    marked = set(keys_of_kind(family_schema(family), "runtime"))
    re_marked = [".".join(key) for key in must_stay_runtime(family) if key not in marked]
    assert re_marked == [], f"{family}: runtime-only keys the schema marks otherwise"


def test_a_finished_run_of_every_family_has_nothing_left_to_do(finished):
    result = snakemake(finished, TINY, "-n")
    assert "Nothing to be done" in result.stdout + result.stderr, result.stdout[-3000:]


@pytest.mark.parametrize("family", FAMILIES)
def test_changing_every_runtime_key_of_a_family_plans_no_job(finished, family):
    config = effective_config()
    overrides, names = runtime_overrides(family, config)
    assert names, f"the schema marks no runtime key in {family}"
    changed = merge_config(copy.deepcopy(TINY), overrides)
    result = snakemake(finished, changed, "-n")
    assert "Nothing to be done" in result.stdout + result.stderr, (
        f"runtime keys {names} re-planned jobs:\n{result.stdout[-3000:]}"
    )


def test_changing_every_key_the_configured_choices_do_not_read_plans_no_job(finished):
    """A key read only under another choice (`x-applies-when`: the embedded texts' seed when
    the texts come from files, the classifier's model when the scorer is profanity-check) is no
    param of any job, so a change re-runs nothing."""
    config = effective_config()
    changed, names = copy.deepcopy(TINY), []
    for family in FAMILIES:
        overrides, family_names = unread_overrides(family_schema(family), config[family])
        changed = merge_config(changed, {family: overrides})
        names += [f"{family}.{name}" for name in family_names]
    assert {"fluency.toxicity.toxic_label", "ssvae.data.path", "fluency.texts.files"} <= set(names)
    result = snakemake(finished, changed, "-n")
    assert "Nothing to be done" in result.stdout + result.stderr, (
        f"unread keys {names} re-planned jobs:\n{result.stdout[-3000:]}"
    )


def job_params(workdir: Path, config: dict[str, Any]) -> dict[str, str]:
    """Each job's params digest, by its first output, from the DAG Snakemake builds in this
    process, which keeps its environment (the Snakefile sets variables for its jobs: steps this
    process runs later must not inherit them)."""
    workdir.mkdir()
    configfile = workdir / "config.yaml"
    configfile.write_text(yaml.safe_dump(config), encoding="utf-8")
    args = argparse.Namespace(
        directory=str(workdir), profile=[], snakefile=str(REPO / "Snakefile"),
        configfile=[str(configfile)], targets=[], persistence_backend=None,
    )  # fmt: skip
    environ = dict(os.environ)
    params = {job.output[0]: job.params for job in plan_jobs(args).jobs if job.output}
    assert dict(os.environ) == environ, "planning left its environment variables behind"
    return params


def test_no_runtime_key_reaches_the_params_of_any_job(tmp_path):
    """Snakemake re-runs a finished job whose params changed: a change of every runtime key of
    every family leaves every job's params as they were, on the DAG of every rule, the
    multi-node training too (a rule the finished run lacks)."""
    config = copy.deepcopy(TINY)
    config["scaling"]["multinode"] = {"enabled": True, "nodes": 2, "gpus_per_node": 1}
    config["scaling"].setdefault("resources", {})["scaling_train"] = {"gpu": 1}
    effective = effective_config(config)
    changed, names = copy.deepcopy(config), []
    for family in FAMILIES:
        overrides, family_names = runtime_overrides(family, effective)
        changed, names = merge_config(changed, overrides), names + family_names
    changed["scaling"]["resources"]["scaling_train"]["gpu"] = 1  # multi-node needs a GPU each
    before = job_params(tmp_path / "before", config)
    assert any("nodes~2" in output for output in before), "the multi-node training is planned"
    after = job_params(tmp_path / "after", changed)
    assert before.keys() == after.keys()
    moved = sorted(output for output in before if before[output] != after[output])
    assert not moved, f"changing the {len(names)} runtime keys changed the params of {moved}"


def test_a_runtime_key_reaches_the_job_it_configures(finished):
    changed = merge_config(copy.deepcopy(TINY), {"fluency": {"cpu_workers": 2}})
    plan = snakemake(finished, changed, "-n", "-p", "--forcerun", "fluency_perplexity")
    command = next(line for line in plan.stdout.splitlines() if "gpuflow perplexity" in line)
    runtime = json.loads(command.split("--runtime '")[1].split("'")[0])
    assert runtime["cpu_workers"] == 2


RESULTS_CHANGES = [
    (
        {"fluency": {"stats": {"seed": 1}}},
        {
            "fluency_stats": 1, "fluency_figures": 1, "fluency_report": 1, "fluency_tables": 1,
            "timeline": 1, "all": 1,
        },
    ),
    (
        {"fluency": {"perplexity": {"stride": 20}}},
        {
            "fluency_perplexity": 2, "fluency_merge": 1, "fluency_stats": 1,
            "fluency_figures": 1, "fluency_report": 1, "fluency_tables": 1, "timeline": 1, "all": 1,
        },
    ),
    (
        {"ssvae": {"data": {"split_seed": 1}}},
        {
            "ssvae_data": 1, "ssvae_train": 2, "ssvae_baseline": 2, "ssvae_aggregate": 1,
            "ssvae_figures": 1, "ssvae_report": 1, "ssvae_tables": 1, "timeline": 1, "all": 1,
        },
    ),
    (
        {"ssvae": {"train": {"labelled_bound_weight": "label_share"}}},  # M2's bound alone
        {
            "ssvae_train": 2, "ssvae_aggregate": 1, "ssvae_figures": 1, "ssvae_report": 1,
            "ssvae_tables": 1, "timeline": 1, "all": 1,
        },
    ),
    (
        {"scaling": {"configurations": {"short": {"train": {"learning_rate": 0.01}}}}},
        {
            "scaling_train": 2, "scaling_summary": 1, "scaling_figures": 1,
            "scaling_report": 1, "scaling_tables": 1, "timeline": 1, "all": 1,
        },
    ),
    (
        {"scaling": {"tf32": True}},
        {
            "scaling_train": 4, "scaling_summary": 1, "scaling_figures": 1,
            "scaling_report": 1, "scaling_tables": 1, "timeline": 1, "all": 1,
        },
    ),
    ({"scaling": {"efficiency_target": 0.5}}, {"scaling_report": 1, "timeline": 1, "all": 1}),
    (
        {"telemetry": {"low_utilisation_percent": 10}},
        {"fluency_report": 1, "ssvae_report": 1, "scaling_report": 1, "timeline": 1, "all": 1},
    ),
    (
        {"sweep": {"gd": {"lr": 0.25}}},
        {
            "sweep_shard": 2, "sweep_aggregate": 1, "sweep_figures": 1, "sweep_tables": 1,
            "timeline": 1, "all": 1,
        },
    ),
]  # fmt: skip


@pytest.mark.parametrize(("change", "expected"), RESULTS_CHANGES)
def test_changing_a_results_key_re_plans_exactly_the_jobs_that_use_it(finished, change, expected):
    changed = merge_config(copy.deepcopy(TINY), copy.deepcopy(change))
    result = snakemake(finished, changed, "-n")
    assert job_counts(result.stdout) == expected


def test_changing_the_telemetry_interval_plans_no_job(finished):
    changed = merge_config(copy.deepcopy(TINY), {"telemetry": {"interval_s": 2}})
    result = snakemake(finished, changed, "-n")
    assert "Nothing to be done" in result.stdout + result.stderr, result.stdout[-3000:]


def run_records(value: Any) -> list[dict[str, Any]]:
    """Every run record in a JSON value: a step's own (top level, or under `run_record`)."""
    if not isinstance(value, dict):
        return []
    if {"host", "slurm_job_id", "telemetry"} <= value.keys():
        return [value]
    return run_records(value.get("run_record"))


def test_every_job_records_cpu_use_and_peak_memory_and_the_reports_show_them(finished):
    results = finished / "results"
    records = {
        str(path.relative_to(results)): record
        for path in results.rglob("*.json")
        if "jobs" not in path.relative_to(results).parts
        for record in run_records(json.loads(path.read_text()))
    }
    writers = {name.split("/")[0] for name in records}
    assert writers == set(FAMILIES), sorted(records)
    assert len(records) >= 8, sorted(records)  # train/baseline per family, ppl, toxicity...
    for name, record in records.items():
        cpu = record["telemetry"]["cpu"]
        assert cpu["cpu_seconds"] > 0 and cpu["util_percent_mean"] > 0, (name, cpu)
        assert cpu["peak_rss_mb"] > 50, (name, cpu)  # every such step imports torch
        assert record["telemetry"]["gpu"]["absent"].startswith("NVML init failed"), name
    assert not list(results.rglob("*.telemetry.json")), "no job file beside the outputs"
    files = list(results.glob("*/jobs/**/*.record.json"))
    for path in files:
        summary = json.loads(path.read_text())
        assert summary["status"] == "finished" and summary["interval_s"] == 0.5, path
        assert summary["cpu"]["peak_rss_mb"] > 0, path
    reports = {
        "ssvae": results / "ssvae" / "summary.md",
        "fluency": results / "fluency" / "summary.md",
        "scaling": results / "scaling" / "performance_report.txt",
    }
    for family, report in reports.items():
        text = report.read_text()
        section = text[text.index("## Jobs: devices used") :]
        folder = results / family
        names = [job_of(p.relative_to(folder), RECORD) for p in folder.rglob("*.record.json")]
        shown = [name for name in names if f"| {name} | finished |" in section]
        assert len(shown) >= 2, (family, names, section)
        assert "% cpu |" in section and " MB |" in section, section


def test_a_forced_sweep_shard_computes_every_seed_again(finished, tmp_path):
    workdir = tmp_path / "copy"
    shutil.copytree(finished, workdir, symlinks=True)
    cell = "results/sweep/shards/method~gd/rank~2/width~4"
    shard = workdir / cell
    assert not job_file(shard / "shard~0.csv", STATE).exists(), "the state goes with the table"
    snakemake(workdir, TINY, f"{cell}/shard~0.csv", "--forcerun", "sweep_shard")
    record = json.loads((shard / "shard~0.run.json").read_text())
    assert record["computed"] == [0, 1, 2] and record["resumed"] == 0
