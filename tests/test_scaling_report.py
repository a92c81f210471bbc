"""Summary tables and the performance report are computed from the measured runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from gpuflow.errors import DataError
from gpuflow.scaling.report import build_report
from gpuflow.scaling.summary import build, cost_table, latex_table, read_runs


def fake_run(
    name: str, world: int, epoch_s: float, comm_s: float, nodes: int = 1, total_s: float = 0.0
) -> dict:
    """A run record shaped like scaling-train's: epoch time, exposed and total all-reduce (s).

    100 steps per epoch, so 1 s of communication per epoch is 10 ms per step; the total
    all-reduce is at least the exposed part.
    """
    total_s = max(total_s, comm_s)
    epochs = [
        {
            "epoch": e + 1, "measured": e > 0, "train_seconds": epoch_s * (1.5 if e == 0 else 1),
            "val_seconds": 1.0, "samples_per_second": 1000 / epoch_s,
            "cpu_seconds_per_process": epoch_s - comm_s,
            "tokens_per_second": 9000 / epoch_s, "comm_exposed_ms": 10 * comm_s,
            "comm_total_ms": 10 * total_s, "comm_probe_steps": 8,
            "val_accuracy": 0.6 + 0.05 * e, "peak_memory_mb": 100.0,
        }
        for e in range(3)
    ]  # fmt: skip
    return {
        "configuration": name, "world_size": world, "nodes": nodes,
        "processes_per_node": world // nodes, "device_type": "cuda", "backend": "nccl",
        "precision": "bf16", "global_batch_size": 32, "per_gpu_batch_size": 32 // world,
        "accumulation_steps": 1, "steps_per_epoch": 100, "parameters": 1_000_000,
        "token_embedding_parameters": 800_000, "allreduce_mb_per_step": 3.8,
        "torch_threads_per_process": 1, "skipped_steps": 0,
        "run_record": {"host": "gpu01", "slurm_job_id": "42"}, "epochs": epochs,
    }  # fmt: skip


@pytest.fixture
def runs() -> list[dict]:
    return [
        fake_run("long", 1, 40.0, 0.0),
        fake_run("long", 2, 21.0, 1.0),
        fake_run("long", 4, 11.5, 1.2),
        fake_run("long", 8, 6.5, 1.5, nodes=2),
        fake_run("tiny", 1, 4.0, 0.0),
        fake_run("tiny", 2, 5.0, 3.0),
        fake_run("tiny", 4, 6.0, 4.5),
    ]


def test_speedup_and_efficiency_use_measured_epochs_against_the_single_node_reference(runs):
    summary = build(runs, [])
    long = summary[summary["configuration"] == "long"].set_index("world_size")
    assert long.loc[4, "epoch_seconds"] == 11.5  # the slower warm-up epoch is left out
    assert long.loc[4, "speedup"] == pytest.approx(40 / 11.5)
    assert long.loc[4, "efficiency"] == pytest.approx(40 / 11.5 / 4)
    assert long.loc[8, "nodes"] == 2 and long.loc[8, "speedup"] == pytest.approx(40 / 6.5)
    assert long.loc[2, "comm_exposed_share"] == pytest.approx(1 / 21)
    assert long.loc[2, "compute_ms_per_step"] == pytest.approx(200.0)


def test_cost_table_gives_gpu_hours_and_speedup_per_extra_gpu_hour(runs):
    cost = cost_table(build(runs, [])).set_index(["configuration", "world_size"])
    one, four = cost.loc[("long", 1)], cost.loc[("long", 4)]
    wall_four = (11.5 * 1.5 + 11.5 * 2 + 3.0) / 3600
    assert four["gpu_hours"] == pytest.approx(4 * wall_four)
    extra = four["gpu_hours"] - one["gpu_hours"]
    assert four["speedup_per_extra_gpu_hour"] == pytest.approx((40 / 11.5 - 1) / extra)
    assert pd.isna(one["speedup_per_extra_gpu_hour"])


def test_the_latex_table_is_booktabs_with_one_row_per_run(runs):
    tex = latex_table(build(runs, []))
    assert tex.count(r"\toprule") == tex.count(r"\bottomrule") == 1
    assert r"\midrule" in tex
    assert tex.count(r"\\") == 1 + len(runs)
    assert r"3.48$\times$" in tex and "8 (2 nodes)" in tex


def test_the_report_blames_communication_where_it_was_measured_to_dominate(runs):
    summary = build(runs, [])
    text = build_report(summary, cost_table(summary), target=0.7)
    assert "tiny scales worse than long" in text
    tiny = summary[(summary["configuration"] == "tiny") & (summary["world_size"] == 4)].iloc[0]
    assert f"tiny {100 * tiny['comm_exposed_share']:.1f}%" in text  # 75.0%, from the data
    assert "NEGATIVE SCALING" in text and "communication dominates" in text
    assert "gradient exchange is not amortised" in text
    assert "(3.00 ms of communication per ms of compute)" in text  # 4.5 s / 1.5 s
    assert "recommended: 8 GPUs on 2 nodes" in text  # long: 77% efficient on 8
    assert "accumulate" in text and "fp16 or bf16" in text


def test_the_report_changes_with_the_numbers_it_is_given(runs):
    balanced = [fake_run("tiny", 1, 4.0, 0.0), fake_run("tiny", 2, 2.1, 0.05)]
    summary = build(balanced, [])
    text = build_report(summary, cost_table(summary), target=0.7)
    assert "good scaling" in text and "communication is minor (2.4% of the epoch)" in text
    assert "no change needed at 2 GPUs" in text
    assert "NEGATIVE SCALING" not in text and "accumulate" not in text


def test_cpu_runs_that_did_not_get_their_cores_are_flagged(runs):
    shared = fake_run("tiny", 2, 5.0, 3.0)
    shared["device_type"] = "cpu"
    for epoch in shared["epochs"]:
        exposed_s = epoch["comm_exposed_ms"] / 10
        epoch["cpu_seconds_per_process"] = 0.5 * (epoch["train_seconds"] - exposed_s)
    alone = {**fake_run("tiny", 1, 4.0, 0.0), "device_type": "cpu"}
    summary = build([alone, shared], [])
    text = build_report(summary, cost_table(summary), target=0.7)
    assert "at 2 processes each process ran on its cores only 50.0% of its compute time" in text
    assert "at 1 process each" not in text


def test_diagnosis_and_predictions_use_the_exposed_all_reduce_and_quote_the_total_beside_it():
    """2 GPUs: 10 s epochs, 4 s of all-reduce per epoch of which overlap hides 3 s (1 s exposed)."""
    runs = [fake_run("mid", 1, 16.0, 0.0), fake_run("mid", 2, 10.0, 1.0, total_s=4.0)]
    summary = build(runs, [])
    two = summary[summary["world_size"] == 2].iloc[0]
    assert two["comm_exposed_ms_per_step"] == pytest.approx(10.0)
    assert two["comm_total_ms_per_step"] == pytest.approx(40.0)
    assert two["compute_ms_per_step"] == pytest.approx(90.0)  # 100 ms step less 10 exposed
    text = build_report(summary, cost_table(summary), target=0.9)
    assert "exposed all-reduce 10.0 ms (10.0% of the epoch) of 40.0 ms total" in text
    assert "overlap hides 75.0%" in text
    # Without the exposed 1 s (not the total 4 s): 16 / 9.
    assert "without the exposed all-reduce the speedup would be 1.78x" in text
    # Accumulating 2 steps: 9 + 1/2 s per epoch -> 1.60 * 10 / 9.5.
    assert "accumulate 2 micro-steps per all-reduce" in text and "1.68x (compute" in text
    # Halving the 4 s total leaves 2 s, of which overlap still hides 3 s: nothing exposed.
    assert "predicted speedup 1.78x (half the total all-reduce" in text


def test_steps_the_fp16_loss_scaler_skipped_are_counted_in_the_tables_and_the_report(runs):
    overflowed = fake_run("tiny", 2, 5.0, 3.0)
    overflowed["skipped_steps"] = 3
    summary = build([fake_run("tiny", 1, 4.0, 0.0), overflowed], [])
    assert summary.set_index("world_size")["skipped_steps"].to_dict() == {1: 0, 2: 3}
    text = build_report(summary, cost_table(summary), target=0.7)
    assert "at 2 GPUs the fp16 loss scaler skipped 3 optimizer step(s) for overflow" in text
    assert "at 1 GPU the fp16" not in text


def test_a_run_record_of_an_older_gpuflow_is_named_with_what_it_lacks(tmp_path: Path):
    """Snakemake keeps a finished training whose params did not change; its record may predate
    a field the tables read (here the fp16 skipped steps, its host, an epoch's peak memory)."""
    old = fake_run("tiny", 2, 5.0, 3.0)
    del old["skipped_steps"], old["run_record"]["host"], old["epochs"][1]["peak_memory_mb"]
    current = tmp_path / "current.json"
    current.write_text(json.dumps(fake_run("tiny", 1, 4.0, 0.0)))
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert read_runs([str(current)])[0]["world_size"] == 1
    with pytest.raises(DataError) as error:
        read_runs([str(current), str(tmp_path / "old.json")])
    assert str(error.value).startswith(f"{tmp_path / 'old.json'}: a run record without")
    assert "without skipped_steps, run_record.host, peak_memory_mb," in str(error.value)
    assert "snakemake --forcerun scaling_train" in str(error.value)
