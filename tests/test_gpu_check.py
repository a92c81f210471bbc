"""gpu-check (`python -m benchmarks.gpu_check`) on a machine without a GPU: every row runs at
tiny sizes and is ok, inside a job as a gpuflow step (output lock, job record).

The same command on a GPU runs the same rows at paper sizes (see docs/gpu-check.md).
Each row is held against a reference that shares no code with the path it checks: the
perplexity rows against Hugging Face's own loss computed here, the SSVAE rows against M2's
loss written out plainly, and a broken path must turn its rows not ok.
"""

from __future__ import annotations

import datetime
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.gpu_check.__main__ import main as gpu_check
from benchmarks.gpu_check.perplexity_check import BOS, random_texts, save_random_lm
from benchmarks.gpu_check.records import compare, latest_record, save_and_compare
from benchmarks.gpu_check.rows import CheckRow
from benchmarks.gpu_check.sizes import tiny_sizes
from benchmarks.gpu_check.ssvae_check import ssvae_rows
from gpuflow.cost.records import this_cpu
from gpuflow.job.paths import RECORD, job_file
from gpuflow.ssvae.model import StackedM2
from tests.conftest import REPO

FAMILIES = (
    "perplexity",
    "out-of-memory",
    "sharded",
    "torch.compile",
    "ssvae",
    "stacked",
    "scaling",
    "sweep",
    "locks",
    "telemetry",
)
CPU = [torch.device("cpu")]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[dict], Path]:
    folder = tmp_path_factory.mktemp("gpu-check")
    out, records = folder / "gpu_check.json", folder / "records"
    argv = ["--size", "tiny", "--device", "cpu", "--out", str(out)]
    code = gpu_check([*argv, "--record-dir", str(records)])
    return code, json.loads(out.read_text()), records


def test_every_row_of_the_cpu_smoke_test_is_ok(smoke):
    code, rows, _ = smoke
    assert [row["path"] for row in rows if not row["ok"]] == []
    assert code == 0


def test_the_command_runs_from_the_repository_root_and_loads_its_options_without_torch():
    help_text = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--help"],
        capture_output=True, text=True, cwd=REPO, check=True,
    ).stdout  # fmt: skip
    assert "--record-dir" in help_text and "--skip-compile" in help_text
    probe = (
        "import sys; from benchmarks.gpu_check.__main__ import build_parser; build_parser(); "
        "print([m for m in ('torch', 'numpy', 'transformers') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO)
    assert done.stdout.strip() == "[]", done.stderr[-2000:]


def test_the_check_runs_in_its_job_and_writes_the_job_record(smoke):
    _, _, records = smoke
    out = records.parent / "gpu_check.json"
    record = json.loads(job_file(out, RECORD).read_text())
    assert record["step"] == "gpu-check" and record["status"] == "finished"
    assert record["outputs"] == [str(out)]


def test_an_output_another_process_writes_is_refused_before_the_check_starts(tmp_path, capsys):
    out = tmp_path / "gpu_check.json"
    holder = subprocess.Popen(
        [
            sys.executable, "-c",
            "import sys, time; from gpuflow.job.outputlock import exclusive_output\n"
            "with exclusive_output(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)",
            str(out),
        ],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert gpu_check(["--size", "tiny", "--device", "cpu", "--out", str(out)]) == 2
    finally:
        holder.kill()
        holder.wait()
    refusal = capsys.readouterr().err.splitlines()
    assert len(refusal) == 1 and f"pid {holder.pid}" in refusal[0], refusal
    assert refusal[0].startswith(f"gpu-check: error: {out}: another job is writing this output")
    assert not out.exists()


def test_every_cuda_path_has_a_row_with_its_tolerance_and_rate(smoke):
    _, rows, _ = smoke
    for family in FAMILIES:
        assert any(family in row["path"] for row in rows), family
    for row in rows:
        assert row["tolerance"] and row["sizes"] == "tiny"
    timed = [row for row in rows if row["unit"] in ("tokens/s", "examples/s")]
    assert len(timed) >= 9
    assert all(row["throughput"] > 0 and row["share_of_peak"] > 0 for row in timed)


def test_perplexity_rows_equal_hugging_faces_own_loss_of_the_same_model_and_texts(smoke, tmp_path):
    """The reference here is `model(ids, labels=ids).loss`: no code of gpuflow's scorer."""
    _, rows, _ = smoke
    sizes = tiny_sizes()
    save_random_lm(tmp_path, sizes.lm, torch.device("cpu"))  # seeded: the check's model
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    context = sizes.lm["n_positions"]
    texts = random_texts(
        sizes.ppl_texts, sizes.ppl_min_tokens, context - 1, sizes.lm["vocab_size"], 0
    )
    expected = []
    with torch.no_grad():
        for tokens in texts[: sizes.ppl_reference_texts]:
            ids = torch.tensor([[BOS, *tokens]])
            expected.append(math.exp(model(ids, labels=ids).loss.item()))
    checked = [row for row in rows if "first_perplexities" in row["extra"]]
    assert len(checked) == 5  # fp32, fp16 and bf16 twins, sharded, compiled
    for row in checked:
        np.testing.assert_allclose(row["extra"]["first_perplexities"], expected, rtol=1e-4)


def test_a_perplexity_scorer_off_by_a_thousandth_fails_its_rows(monkeypatch, tmp_path):
    from benchmarks.gpu_check.perplexity_check import precision_rows
    from gpuflow.fluency import ppl_scoring

    honest = ppl_scoring.target_nll
    monkeypatch.setattr(ppl_scoring, "target_nll", lambda *args: honest(*args) * 1.001)
    sizes = tiny_sizes()
    n_params = save_random_lm(tmp_path, sizes.lm, torch.device("cpu"))
    rows = precision_rows(tmp_path, n_params, sizes, CPU, {"float32": 1.0}, compile=False)
    assert "float32" in rows[0].path and not rows[0].ok
    assert len(rows) == 4 and not any("torch.compile" in row.path for row in rows)


def ssvae_tiny_rows() -> list[CheckRow]:
    return ssvae_rows(tiny_sizes().ssvae, torch.device("cpu"), 1.0)


def test_ssvae_rows_hold_every_run_to_m2_written_out_plainly():
    rows = ssvae_tiny_rows()
    assert [row.ok for row in rows] == [True, True, True]
    for row in rows:
        assert row.deviation.startswith("plain M2 ")
        assert float(row.deviation.split()[2].rstrip(";")) <= 1e-4


def test_an_unlabelled_bound_without_the_entropy_of_q_fails_every_ssvae_row(monkeypatch):
    """Stacked and one-by-one share this bug, so only the plain reference can catch it."""

    def no_entropy(self, x, eps):
        log_q = torch.log_softmax(self.classifier.logits(x), dim=-1)
        terms = self.neg_elbo(x, eps)
        return {"neg_bound": (log_q.exp() * terms["neg_elbo"]).sum(-1), "log_q": log_q}

    monkeypatch.setattr(StackedM2, "unlabelled_terms", no_entropy)
    assert [row.ok for row in ssvae_tiny_rows()] == [False, False, False]


def test_a_run_writes_its_record_with_environment_and_every_row(smoke):
    _, rows, records = smoke
    [written] = records.iterdir()
    record = json.loads(written.read_text())
    created = datetime.datetime.fromisoformat(record["created"])
    assert datetime.datetime.now(datetime.UTC) - created < datetime.timedelta(hours=1)
    # named by the day it was made (not the day this test runs: no flake at midnight)
    cpu = this_cpu()
    assert written.name == f"{created.date().isoformat()}-2x-{cpu}.json"  # two CPU workers
    assert record["rows"] == rows and record["device_class"] == cpu
    assert record["torch"] == torch.__version__ and record["devices"] == ["cpu", "cpu"]
    assert {"driver", "cuda", "commit", "created"} <= set(record)
    assert latest_record(records, f"2x-{cpu}") == written


def test_the_next_run_prints_each_rows_change_against_the_latest_record_of_its_device(
    smoke, tmp_path
):
    _, rows, _ = smoke
    then = [dict(row) for row in rows]
    then[0] = {**then[0], "throughput": rows[0]["throughput"] / 2, "ok": False}
    older = [{**row, "throughput": 1.0} for row in rows]
    cpu = this_cpu()
    for day, old_rows in (("2026-01-01", older), ("2026-02-01", then)):
        record = {"created": day, "rows": old_rows}
        (tmp_path / f"{day}-{cpu}.json").write_text(json.dumps(record))
    (tmp_path / "2026-03-01-nvidia-h100.json").write_text(json.dumps({"rows": []}))
    assert latest_record(tmp_path, cpu).name == f"2026-02-01-{cpu}.json"
    when = datetime.datetime(2026, 3, 2, tzinfo=datetime.UTC)
    path, lines = save_and_compare(tmp_path, rows, CPU, Path.cwd(), when)
    assert path.name == f"2026-03-02-{cpu}.json" and f"2026-02-01-{cpu}.json" in lines[0]
    first = next(line for line in lines if line.startswith(rows[0]["path"][:70]))
    assert "2.00x" in first and "(was NO)" in first
    assert sum("1.00x" in line for line in lines) == len(rows) - 1 - sum(
        row["throughput"] is None for row in rows
    )


def test_a_run_of_some_sections_has_only_their_rows_and_keeps_the_whole_runs_record(
    smoke, tmp_path
):
    _, rows, records = smoke
    [whole] = records.iterdir()
    folder = tmp_path / "records"
    folder.mkdir()
    (folder / whole.name).write_bytes(whole.read_bytes())
    out = tmp_path / "gpu_check.json"
    argv = ["--size", "tiny", "--device", "cpu", "--out", str(out)]
    assert gpu_check([*argv, "--sections", "locks", "telemetry", "--record-dir", str(folder)]) == 0
    ran = json.loads(out.read_text())
    assert [row["path"] for row in ran] == [
        row["path"] for row in rows if row["path"].startswith(("GPU locks", "telemetry"))
    ]
    partial = folder / whole.name.replace(".json", "-locks-telemetry.json")
    assert json.loads(partial.read_text())["sections"] == ["locks", "telemetry"]
    assert (folder / whole.name).read_bytes() == whole.read_bytes()
    assert latest_record(folder, f"2x-{this_cpu()}") == folder / whole.name


def test_a_run_of_some_sections_names_no_row_of_the_others_gone():
    row = {"path": "a", "throughput": 2.0, "share_of_peak": 0.5, "ok": True}
    lines = compare({"rows": [row, {**row, "path": "b"}]}, [row], of_whole_run=False)
    assert not any("row gone" in line for line in lines) and "1.00x" in lines[1]


def test_rows_that_only_one_record_has_are_named():
    row = {"path": "a", "throughput": 2.0, "share_of_peak": 0.5, "ok": True}
    lines = compare({"rows": [{**row, "path": "b"}]}, [row])
    assert "new row: a" in lines and "row gone: b" in lines


def test_a_row_beyond_its_tolerance_is_not_ok_and_fails_the_command(tmp_path, monkeypatch):
    from benchmarks.gpu_check import run as check_run

    def one_bad_row(*args):
        return [CheckRow("made up", ok=False, tolerance="<= 1", deviation="2")]

    monkeypatch.setattr(check_run, "run_checks", one_bad_row)
    out = tmp_path / "gpu_check.json"
    assert gpu_check(["--size", "tiny", "--device", "cpu", "--out", str(out)]) == 1
    assert json.loads(out.read_text())[0]["ok"] is False
