"""A catalogue of bad inputs: each is refused with a message that names the key or the file (and
the row), says what is wrong and what is expected, and leaves nothing half-written.

Other suites hold more cases of their own (tests/test_config.py, BAD_FILES in
tests/test_fluency_texts.py, BAD_CONFIGS in tests/test_fluency_workflow.py,
tests/test_ssvae_data.py, tests/test_scaling_data.py, tests/test_perplexity.py); this table adds
the ones they lack, over every family, through the entry points a user meets: the workflow's
config check and the `gpuflow <step>` command line.
"""

from __future__ import annotations

import copy
import importlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gpuflow.cli import main as gpuflow_main
from gpuflow.errors import ConfigError
from gpuflow.settings.validate import load_config, validate_config
from tests.conftest import REPO, snakemake
from tests.idx_files import write_idx

# --- config values: checked by the schema before any job -------------------------------------

BAD_CONFIG_VALUES: dict[str, tuple[Callable[[dict], None], list[str]]] = {
    "an unknown top-level key": (
        lambda c: c.update(fluencyy={}),
        ["config key '<top level>'", "'fluencyy' was unexpected", "one of the known keys"],
    ),
    "an unknown family": (
        lambda c: c.update(families=["fluency", "vision"]),
        ["config key 'families.1'", "'vision' is not one of", "'fluency', 'ssvae'"],
    ),
    "an empty ssvae grid": (
        lambda c: c["ssvae"]["grid"].update(fractions=[]),
        ["config key 'ssvae.grid.fractions'", "should be non-empty", "expected"],
    ),
    "a label fraction above 1": (
        lambda c: c["ssvae"]["grid"].update(fractions=[0.1, 1.5]),
        ["config key 'ssvae.grid.fractions.1'", "1.5 is greater than or equal to the maximum of 1"],
    ),
    "epochs given as text": (
        lambda c: c["ssvae"]["train"].update(epochs="3"),
        ["config key 'ssvae.train.epochs'", "'3' is not of type 'integer'", "expected"],
    ),
    "an empty list of sweep methods": (
        lambda c: c["sweep"].update(methods=[]),
        ["config key 'sweep.methods'", "should be non-empty"],
    ),
    "a negative number of seeds": (
        lambda c: c["sweep"].update(n_seeds=-1),
        ["config key 'sweep.n_seeds'", "-1 is less than the minimum", "expected"],
    ),
    "a world size of zero": (
        lambda c: c["scaling"].update(world_sizes=[0, 2]),
        ["config key 'scaling.world_sizes.0'", "0 is less than the minimum of 1"],
    ),
    "a misspelt key inside a scaling configuration": (
        lambda c: c["scaling"]["configurations"]["short"].update(modle={"d_model": 8}),
        ["config key 'scaling.configurations.short'", "'modle' was unexpected", "'model'"],
    ),
    "a resources block with negative memory": (
        lambda c: c["fluency"]["resources"]["fluency_perplexity"].update(mem_mb=-100),
        ["config key 'fluency.resources.fluency_perplexity.mem_mb'", "less than the minimum"],
    ),
    "a confidence level of 1": (
        lambda c: c["fluency"]["stats"].update(confidence=1),
        ["config key 'fluency.stats.confidence'", "expected"],
    ),
    "a list where a mapping belongs": (
        lambda c: c.update(sweep=[1, 2]),
        ["config key 'sweep'", "is not of type 'object'"],
    ),
}


@pytest.fixture(scope="module")
def default_config() -> dict:
    return load_config(REPO / "config" / "config.yaml")


@pytest.mark.parametrize("case", sorted(BAD_CONFIG_VALUES))
def test_a_bad_config_value_names_the_key_the_problem_and_what_is_expected(default_config, case):
    change, parts = BAD_CONFIG_VALUES[case]
    config = copy.deepcopy(default_config)
    change(config)
    with pytest.raises(ConfigError) as raised:
        validate_config(config)
    message = str(raised.value)
    for part in parts:
        assert part in message, (part, message)


# --- config values the workflow checks across keys (Snakefile), through real Snakemake -------

BAD_WORKFLOW_CONFIGS: dict[str, tuple[dict, list[str]]] = {
    "a scaling run naming no configuration": (
        {"families": ["scaling"], "scaling": {"run": ["short", "agnews_huge"]}},
        ["config key 'scaling.run'", "'agnews_huge'", "not in scaling.configurations", "known:"],
    ),
    "a batch that does not split over the world size": (
        {
            "families": ["scaling"],
            "scaling": {
                "run": ["short"],
                "world_sizes": [1, 3],
                "configurations": {"short": {"train": {"global_batch_size": 32}}},
            },
        },
        ["config key 'scaling.configurations.short.train.global_batch_size'", "world size 3"],
    ),
    "idx digits without a folder": (
        {"families": ["ssvae"], "ssvae": {"data": {"source": "idx"}}},
        ["config key 'ssvae.data.path'", "empty", "expected the MNIST IDX folder"],
    ),
    "a schema error reaches the user as one line": (
        {"families": ["sweep"], "sweep": {"shard_size": 0}},
        ["config key 'sweep.shard_size'", "0 is less than the minimum of 1"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_WORKFLOW_CONFIGS))
def test_a_bad_workflow_config_stops_a_dry_run_with_the_key_and_no_traceback(tmp_path, case):
    config, parts = BAD_WORKFLOW_CONFIGS[case]
    result = snakemake(tmp_path, config, "--dry-run", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    for part in parts:
        assert part in output, (part, output[-3000:])
    assert "Traceback" not in output
    assert not (tmp_path / "results").exists()


@pytest.mark.workflow
def test_a_model_path_that_is_a_file_stops_a_real_run_before_any_job(tmp_path):
    model = tmp_path / "gpt2.bin"
    model.write_bytes(b"\x00" * 64)
    config = {"families": ["fluency"], "fluency": {"lm": {"path": str(model)}}}
    result = snakemake(tmp_path, config, check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "config key 'fluency.lm.path'" in output and "has no config.json" in output
    assert "expected a Hugging Face model folder" in output
    assert not (tmp_path / "results").exists()


# --- data files, through `gpuflow <step>` ----------------------------------------------------


def mnist_folder(root: Path, train_labels: np.ndarray | None = None, n_images: int = 20) -> Path:
    """A torchvision-layout MNIST folder of random digits; labels may be replaced."""
    rng = np.random.default_rng(0)
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    labels = np.arange(n_images, dtype=np.uint8) % 10
    for split in ("train", "t10k"):
        write_idx(
            raw / f"{split}-images-idx3-ubyte",
            rng.integers(0, 256, (n_images, 28, 28), dtype=np.uint8),
        )
        chosen = train_labels if split == "train" and train_labels is not None else labels
        write_idx(raw / f"{split}-labels-idx1-ubyte", chosen)
    return root


def idx_data(folder: Path) -> list[str]:
    settings = {"data": {"source": "idx", "path": str(folder)}}
    return ["ssvae-data", "--settings", json.dumps(settings)]


def idx_label_12(tmp: Path) -> list[str]:
    labels = np.arange(20, dtype=np.uint8) % 10
    labels[7] = 12
    return idx_data(mnist_folder(tmp / "mnist", labels))


def idx_count_mismatch(tmp: Path) -> list[str]:
    labels = np.arange(19, dtype=np.uint8) % 10
    return idx_data(mnist_folder(tmp / "mnist", labels))


def idx_gzip_not_gzip(tmp: Path) -> list[str]:
    root = mnist_folder(tmp / "mnist")
    raw = root / "MNIST" / "raw"
    (raw / "t10k-labels-idx1-ubyte").unlink()
    (raw / "t10k-labels-idx1-ubyte.gz").write_bytes(b"plain bytes, not gzip")
    return idx_data(root)


def texts(tmp: Path, name: str, content: bytes, **extra: object) -> list[str]:
    (tmp / name).write_bytes(content)
    settings = {"texts": {"source": "files", "files": [str(tmp / name)], **extra}}
    return ["fluency-texts", "--settings", json.dumps(settings)]


def scaling_data(data: dict) -> list[str]:
    settings = {"configurations": {"x": {"data": data}}}
    return ["scaling-data", "--name", "x", "--settings", json.dumps(settings)]


def agnews(tmp: Path, content: str) -> list[str]:
    (tmp / "train.csv").write_text(content)
    return scaling_data({"source": "agnews", "path": str(tmp / "train.csv")})


def imdb(tmp: Path, content: str | None = None, folder: bool = False) -> list[str]:
    path = tmp / ("aclImdb" if folder else "imdb.csv")
    if folder:
        (path / "train" / "pos").mkdir(parents=True)
        (path / "train" / "pos" / "0_9.txt").write_text("Great.")
    else:
        path.write_text(content or "")
    return scaling_data({"source": "imdb", "path": str(path)})


def not_a_causal_lm(tmp: Path) -> list[str]:
    from transformers import DistilBertConfig

    folder = tmp / "classifier"
    DistilBertConfig(dim=32, n_layers=1, n_heads=2, hidden_dim=64).save_pretrained(folder)
    (tmp / "t.csv").write_text("text_id,text\na,Fine film.\n")
    return [
        "perplexity",
        "--texts",
        str(tmp / "t.csv"),
        "--model",
        str(folder),
        "--runtime",
        '{"device": "cpu"}',
    ]


def not_a_prepared_dataset(tmp: Path) -> list[str]:
    (tmp / "mnist.npz").write_bytes(b"PK\x03\x04 truncated")
    return [
        "ssvae-train", "--model", "m2", "--data", str(tmp / "mnist.npz"), "--frac", "0.1",
        "--corrupt", "0", "--alpha", "1", "--seeds", "0", "--settings", "{}",
    ]  # fmt: skip


# case -> (arguments for `gpuflow` given a scratch folder, the output option, message parts)
BAD_FILES: dict[str, tuple[Callable[[Path], list[str]], str, list[str]]] = {
    "an IDX label outside 0-9": (
        idx_label_12,
        "--out",
        ["train-labels-idx1-ubyte", "label 12", "expected 0-9"],
    ),
    "IDX labels and images of different counts": (
        idx_count_mismatch,
        "--out",
        ["train-labels-idx1-ubyte", "19", "20 images"],
    ),
    "a .gz IDX file that is not gzip": (
        idx_gzip_not_gzip,
        "--out",
        ["t10k-labels-idx1-ubyte.gz", "cannot read IDX file"],
    ),
    "a text file that is an image": (
        lambda t: texts(t, "texts.csv", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xd8"),
        "--out",
        ["texts.csv", "not UTF-8 text on line 1"],
    ),
    "a text file with a header and no rows": (
        lambda t: texts(t, "texts.csv", b"id,text\n"),
        "--out",
        ["texts.csv", "no rows below the header", "expected a header row and data rows"],
    ),
    "a JSONL line that is a list": (
        lambda t: texts(t, "texts.jsonl", b'{"text": "ok"}\n["not", "an", "object"]\n'),
        "--out",
        ["texts.jsonl", "row 2", "not an object"],
    ),
    "a group column the file lacks": (
        lambda t: texts(t, "texts.tsv", b"text\tmodel\nHello\tgpt2\n", group_columns=["method"]),
        "--out",
        ["texts.tsv", "missing column(s) ['method']"],
    ),
    "an AG News class outside 1-4": (
        lambda t: agnews(t, "1,a,b\n2,c,d\n0,e,f\n3,g,h\n"),
        "--out-train",
        ["train.csv", "row 3", "class '0'", "expected a class index 1..4"],
    ),
    "an AG News file of two columns": (
        lambda t: agnews(t, "1,title only\n2,another\n"),
        "--out-train",
        ["train.csv", "2 columns", "expected 3: class,title,description"],
    ),
    "an IMDB CSV without a label column": (
        lambda t: imdb(t, "review,stars\nGood,5\nBad,1\n"),
        "--out-train",
        ["imdb.csv", "expected"],
    ),
    "an aclImdb folder without neg/": (
        lambda t: imdb(t, folder=True),
        "--out-train",
        ["aclImdb", "no 'neg' folder", "expected aclImdb layout"],
    ),
    "a model folder that is not a causal LM": (
        not_a_causal_lm,
        "--out",
        ["classifier", "not a causal language model"],
    ),
    "a prepared dataset that is not one": (
        not_a_prepared_dataset,
        "--out",
        ["mnist.npz", "not a prepared SSVAE dataset"],
    ),
}

OUT_OPTIONS = {
    "--out": ["--out"],
    "--out-train": ["--out-train", "--out-val", "--out-info"],
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_data_file_is_one_line_naming_file_row_and_problem_and_nothing_is_written(
    tmp_path, capsys, case
):
    build, out_option, parts = BAD_FILES[case]
    argv = build(tmp_path)
    out = tmp_path / "out"
    for option in OUT_OPTIONS[out_option]:
        argv += [option, str(out / f"{option.strip('-')}.file")]
    capsys.readouterr()
    assert gpuflow_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gpuflow {argv[0]}: error: "), err
    assert len(err.splitlines()) == 1, err
    for part in parts:
        assert part in err, (part, err)
    # no output; only the failed job's record (gpuflow.job.record) may lie in its jobs folder
    written = [p for p in out.glob("*") if p.name != "jobs"]
    assert not written, written


# Every test of the suite that feeds one bad input (or a table of them) and checks the message.
REFUSAL_TESTS = {
    "tests.test_config": [
        "test_a_bad_value_names_its_key_and_the_problem",
        "test_step_settings_name_the_key_of_bad_json_or_an_unknown_setting",
    ],
    "tests.test_fluency_texts": [
        "test_a_bad_text_file_names_the_file_row_and_problem",
        "test_the_cli_reports_bad_input_in_one_line_and_leaves_no_output",
        "test_a_group_column_that_would_overwrite_another_is_refused",
    ],
    "tests.test_fluency_workflow": ["test_a_bad_config_stops_before_any_job_and_names_the_key"],
    "tests.test_ssvae_data": [
        "test_a_missing_idx_file_is_named",
        "test_a_missing_folder_is_a_data_error",
        "test_a_malformed_idx_file_is_a_data_error_naming_the_file",
        "test_a_truncated_gzip_is_a_data_error",
        "test_images_of_the_wrong_shape_are_refused",
        "test_the_cli_reports_a_bad_data_path_in_one_line_with_status_2",
    ],
    "tests.test_scaling_data": [
        "test_an_imdb_csv_with_an_unknown_label_names_the_row",
        "test_an_ag_news_row_with_a_bad_class_names_file_and_row",
        "test_missing_user_files_and_oversized_samples_are_reported_with_their_key",
    ],
    "tests.test_perplexity": [
        "test_a_folder_that_is_not_a_causal_lm_is_a_clear_error_naming_it",
        "test_a_folder_without_a_model_is_a_clear_error_naming_it",
        "test_an_empty_text_is_rejected_naming_its_id",
        "test_half_precision_on_the_cpu_is_refused",
        "test_a_stride_not_below_the_context_is_refused",
    ],
    "tests.test_hardening_bad_input": [
        "test_a_bad_config_value_names_the_key_the_problem_and_what_is_expected",
        "test_a_bad_workflow_config_stops_a_dry_run_with_the_key_and_no_traceback",
        "test_a_model_path_that_is_a_file_stops_a_real_run_before_any_job",
        "test_a_bad_data_file_is_one_line_naming_file_row_and_problem_and_nothing_is_written",
    ],
    "tests.test_hardening_failures": ["test_a_bad_config_file_is_one_line_naming_file_and_key"],
    "tests.test_hardening_faults": [
        "test_a_full_disk_is_one_line_naming_the_output_and_leaves_nothing",
        "test_a_read_only_folder_is_one_line_naming_the_output",
        "test_an_output_path_through_a_regular_file_is_one_line_naming_it",
        "test_a_workflow_whose_results_folder_is_a_file_stops_with_a_clear_error",
    ],
}


def collected_cases(module_name: str, test_name: str) -> int:
    """How many cases pytest runs for one test (the product of its parametrize tables)."""
    test = getattr(importlib.import_module(module_name), test_name)  # missing: the list is stale
    cases = 1
    for mark in getattr(test, "pytestmark", []):
        if mark.name == "parametrize":
            cases *= len(mark.args[1])
    return cases


def test_the_suite_refuses_more_than_70_bad_configs_and_data_files_as_the_docs_say():
    total = sum(
        collected_cases(module, test) for module, tests in REFUSAL_TESTS.items() for test in tests
    )
    assert total >= 70, total
    assert "70+ bad configs and data files" in (REPO / "docs" / "recovery.md").read_text()
