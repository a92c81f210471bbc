"""Two kinds of setting, seen from Snakemake: after a finished run of every family, a change of
any runtime-only key (read from the schema) plans no job, a change of a results key re-plans
exactly the jobs that use it, and a forced sweep shard computes its seeds again.

One finished tiny run is shared by every check; each check is a dry run against it.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpuflow.config import load_config, merge_config
from gpuflow.settings import family_schema, keys_of_kind
from tests.conftest import REPO, job_counts, snakemake

pytestmark = pytest.mark.workflow

FAMILIES = ["fluency", "ssvae", "scaling", "sweep"]
TINY = {
    "families": FAMILIES,
    "fluency": {
        "texts": {"n_texts": 8, "max_words": 30, "seed": 3},
        "lm": {
            "train": {
                "n_texts": 100, "steps": 5, "vocab_size": 300, "n_layer": 1, "n_embd": 16,
                "n_head": 2, "n_positions": 64, "batch_size": 8, "seed": 3,
            }
        },
        "perplexity": {"shards": 1, "token_budget": 1024},
        "stats": {"n_bootstrap": 20, "n_bins": 2},
    },
    "ssvae": {
        "grid": {"fractions": [0.1], "corruption_rates": [0.0], "alphas": [1], "seeds": [0]},
        "model": {"hidden": 8, "latent": 2},
        "train": {"epochs": 1, "batch_size": 1000, "labelled_batch_size": 50},
    },
    "scaling": {
        "run": ["short"],
        "world_sizes": [1, 2],
        "configurations": {
            "short": {
                "data": {"corpus": "rotten_tomatoes", "n_train": 128, "n_val": 32},
                "tokenizer": {"vocab_size": 200},
                "model": {
                    "d_model": 8, "n_heads": 2, "n_layers": 1, "ffn_dim": 16, "max_seq_len": 16,
                },
                "train": {"epochs": 2, "global_batch_size": 16},
            }
        },
        "baseline": {"max_features": 200},
    },
    "sweep": {
        "teacher_ranks": [2],
        "student_widths": [4],
        "n_seeds": 2,
        "shard_size": 2,
        "gd": {"max_steps": 200},
        "gnc": {"max_guesses": 2000, "batch_size": 1024},
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished run of every family; checks dry-run against it and must leave it finished."""
    workdir = tmp_path_factory.mktemp("finished")
    snakemake(workdir, TINY)
    return workdir


def effective_config() -> dict[str, Any]:
    """The config the workflow sees: config/config.yaml with TINY merged over it, defaulted."""
    return merge_config(load_config(REPO / "config" / "config.yaml"), copy.deepcopy(TINY))


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
    if isinstance(value, int):
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


def runtime_overrides(family: str, config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Every runtime-only key of the family set to another valid value, and the keys' names."""
    overrides: dict[str, Any] = {}
    names = []
    for pattern in keys_of_kind(family_schema(family), "runtime"):
        for path in expand_names(pattern, config[family]):
            current = config[family]
            for name in path:
                current = current[name]
            value = other_value(leaf_schema(family, pattern), current)
            assert value != current
            node = overrides
            for name in path[:-1]:
                node = node.setdefault(name, {})
            node[path[-1]] = value
            names.append(".".join((family, *path)))
    return {family: overrides}, names


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
            "all": 1,
        },
    ),
    (
        {"fluency": {"perplexity": {"stride": 20}}},
        {
            "fluency_perplexity": 1, "fluency_merge": 1, "fluency_stats": 1,
            "fluency_figures": 1, "fluency_report": 1, "fluency_tables": 1, "all": 1,
        },
    ),
    (
        {"ssvae": {"data": {"split_seed": 1}}},
        {
            "ssvae_data": 1, "ssvae_train": 1, "ssvae_baseline": 1, "ssvae_aggregate": 1,
            "ssvae_figures": 1, "ssvae_report": 1, "ssvae_tables": 1, "all": 1,
        },
    ),
    (
        {"scaling": {"configurations": {"short": {"train": {"learning_rate": 0.01}}}}},
        {
            "scaling_train": 2, "scaling_summary": 1, "scaling_figures": 1,
            "scaling_report": 1, "scaling_tables": 1, "all": 1,
        },
    ),
    ({"scaling": {"efficiency_target": 0.5}}, {"scaling_report": 1, "all": 1}),
    (
        {"sweep": {"gd": {"lr": 0.25}}},
        {
            "sweep_shard": 1, "sweep_aggregate": 1, "sweep_figures": 1, "sweep_tables": 1,
            "all": 1,
        },
    ),
]  # fmt: skip


@pytest.mark.parametrize(("change", "expected"), RESULTS_CHANGES)
def test_changing_a_results_key_re_plans_exactly_the_jobs_that_use_it(finished, change, expected):
    changed = merge_config(copy.deepcopy(TINY), copy.deepcopy(change))
    result = snakemake(finished, changed, "-n")
    assert job_counts(result.stdout) == expected


def test_a_forced_sweep_shard_computes_every_seed_again(finished, tmp_path):
    workdir = tmp_path / "copy"
    shutil.copytree(finished, workdir, symlinks=True)
    cell = "results/sweep/shards/method~gd/rank~2/width~4"
    shard = workdir / cell
    assert not (shard / "shard~0.progress.jsonl").exists(), "progress goes with the table"
    snakemake(workdir, TINY, f"{cell}/shard~0.csv", "--forcerun", "sweep_shard")
    record = json.loads((shard / "shard~0.run.json").read_text())
    assert record["computed"] == [0, 1] and record["resumed"] == 0
