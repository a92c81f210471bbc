"""gpuflow.job: every step runs in one job context that owns its files.

- job files live in one place per family (`results/<family>/jobs/`), never beside the outputs,
  and a finished step leaves exactly one record there;
- one resume state format: fingerprinted by input content, results settings and the gpuflow
  version; another state (or an older gpuflow's) is ignored with one line; a state is kept
  until the run has accepted the outputs;
- one progress file format, written by every long step of every family;
- `gpuflow status` reads those progress files only: rewording every training log line changes
  nothing it shows;
- the divergence guard stops a run at a loss term that is NaN or infinite, either sign.
"""

from __future__ import annotations

import builtins
import json
import math
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import gpuflow
from gpuflow.cli import main as gpuflow_main
from gpuflow.job import Job, current
from gpuflow.job import progress as progress_module
from gpuflow.job.divergence import TrainingDivergedError
from gpuflow.job.finished_states import RECORDS_ENV, clean
from gpuflow.job.paths import PROGRESS, RECORD, STATE, job_file, job_of
from gpuflow.job.progress import KEYS
from gpuflow.job.state import State, make_fingerprint
from gpuflow.ops.plan import Job as PlannedJob
from gpuflow.ops.status.progress import job_progress
from gpuflow.ssvae.train import Run, train
from tests.test_fluency_stop_resume import perplexity_argv, texts  # noqa: F401 (fixture)
from tests.test_perplexity import reviews, tiny_lm  # noqa: F401 (fixtures)
from tests.test_scaling_ddp import prepare, settings, train_command
from tests.test_ssvae_train import data_path, tiny  # noqa: F401 (fixture)
from tests.test_sweep_shard import SETTINGS as SHARD_SETTINGS
from tests.test_sweep_shard import shard_command

# --- where job files live ---------------------------------------------------------------------


def test_job_files_live_in_the_family_jobs_folder_never_beside_the_outputs():
    out = Path("results/ssvae/frac~0.01/alpha~1.0/seed~3/metrics.json")
    assert job_file(out, PROGRESS) == Path(
        "results/ssvae/jobs/frac~0.01/alpha~1.0/seed~3/metrics.json.progress.json"
    )
    assert job_file("/w/results/fluency/summary.md", RECORD) == Path(
        "/w/results/fluency/jobs/summary.md.record.json"
    )
    assert job_file("/tmp/x/out.csv", STATE) == Path("/tmp/x/jobs/out.csv.state.pt")
    assert job_of("jobs/frac~0.01/seed~3/metrics.json.record.json", RECORD) == (
        "frac~0.01/seed~3/metrics.json"
    )
    with pytest.raises(ValueError, match="unknown job file kind"):
        job_file(out, "telemetry.json")


def test_a_step_leaves_one_record_in_its_family_jobs_folder_and_nothing_beside_its_output(
    tmp_path,
):
    out = tmp_path / "results" / "probe" / "gpu~0.json"
    assert gpuflow_main(["probe", "--out", str(out), "--hold", "0"]) == 0
    files = sorted(p for p in (tmp_path / "results").rglob("*") if p.is_file())
    record_file = tmp_path / "results" / "probe" / "jobs" / "gpu~0.json.record.json"
    assert files == [out, record_file]
    record = json.loads(record_file.read_text())
    assert record["step"] == "probe" and record["outputs"] == [str(out)]
    assert record["status"] == "finished" and record["host"] == socket.gethostname()
    assert record["started"] <= record["ended"]
    assert {"cpu", "gpu", "timings"} <= record.keys(), "the telemetry is in the record"


# --- one resume state -------------------------------------------------------------------------


def test_a_state_is_fingerprinted_by_input_content_results_settings_and_version(
    tmp_path, monkeypatch
):
    data = tmp_path / "data.npz"
    data.write_bytes(b"one")
    base = make_fingerprint([data], {"lr": 0.1}, ["run 0"])
    assert make_fingerprint([data], {"lr": 0.1}, ["run 0"]) == base
    assert make_fingerprint([data], {"lr": 0.2}, ["run 0"]) != base
    assert make_fingerprint([data], {"lr": 0.1}, ["run 1"]) != base
    data.write_bytes(b"two")
    assert make_fingerprint([data], {"lr": 0.1}, ["run 0"]) != base, "same name, other content"
    data.write_bytes(b"one")
    monkeypatch.setattr(gpuflow, "__version__", "99.0")
    assert make_fingerprint([data], {"lr": 0.1}, ["run 0"]) != base


def test_a_state_saved_is_loaded_back_only_by_the_same_fingerprint(tmp_path, capsys):
    out = tmp_path / "results" / "ssvae" / "m.json"
    State(out, "same").save({"epoch": 3, "weights": torch.ones(2)})
    saved = torch.load(job_file(out, STATE), weights_only=True)
    assert saved["fingerprint"] == "same" and saved["gpuflow"] == gpuflow.__version__
    loaded = State(out, "same").load()
    assert loaded["epoch"] == 3 and torch.equal(loaded["weights"], torch.ones(2))
    capsys.readouterr()
    assert State(out, "other").load() is None
    assert capsys.readouterr().out == (
        f"ignoring {job_file(out, STATE)}: it belongs to other inputs, settings or gpuflow"
        " version; starting over\n"
    )


def test_an_older_gpuflow_s_state_beside_the_outputs_is_ignored_with_one_line(tmp_path, capsys):
    out = tmp_path / "frac~0.1" / "seed~0" / "metrics.json"
    old = tmp_path / "frac~0.1" / "train_state.pt"
    old.parent.mkdir(parents=True)
    torch.save({"fingerprint": "x", "epoch": 2}, old)
    assert State(out, "x").load() is None
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"ignoring {old}: a resume state of an older gpuflow (states now live in"
        f" {job_file(out, STATE).parent}/); starting over"
    ]
    assert old.exists(), "ignored, not removed"


def test_a_state_is_kept_until_the_run_has_accepted_the_outputs(tmp_path, monkeypatch):
    records = tmp_path / "records"
    monkeypatch.setenv(RECORDS_ENV, str(records))
    out = tmp_path / "results" / "sweep" / "shard~0.csv"
    job = current([out])
    state = job.state(settings={"a": 1})
    job.units(state, 3, "seeds", load=len, save=lambda: {"seeds": 3}).finished(3, "at the end")
    job.release()
    kept = [job_file(out, STATE), job_file(out, PROGRESS)]
    assert all(path.exists() for path in kept), "the outputs are not accepted yet"
    assert clean(records) == [] and all(path.exists() for path in kept), "an output is missing"
    out.write_text("table\n")
    assert clean(records) == [path.resolve() for path in kept]
    assert not any(path.exists() for path in kept)


def test_a_step_run_by_hand_drops_its_state_once_its_outputs_are_written(tmp_path, monkeypatch):
    monkeypatch.delenv(RECORDS_ENV, raising=False)
    out = tmp_path / "out.csv"
    job = current([out])
    job.state().save({"x": 1})
    job.release()
    assert not job_file(out, STATE).exists()


# --- the divergence guard ---------------------------------------------------------------------


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "+inf", "-inf"])
def test_a_loss_term_that_is_nan_or_infinite_stops_the_run_naming_it_and_the_kept_state(
    tmp_path, value
):
    out = tmp_path / "results" / "ssvae" / "metrics.json"
    job = current([out])
    job.state(settings={"lr": 0.1}).save({"epoch": 2})
    terms = {"train_loss": 1.5, "kl": value, "test_loss": 2.0}
    with pytest.raises(TrainingDivergedError) as stopped:
        job.check_finite("seed=0", 3, terms)
    assert str(stopped.value) == (
        f"run seed=0: loss term 'kl' is {value} at epoch 3; training stopped, the last good"
        f" state (after epoch 2) is kept in {job_file(out, STATE)}"
        " (lower the learning rate or check the data)"
    )


def test_finite_loss_terms_however_large_let_the_run_go_on(tmp_path):
    job = current([tmp_path / "metrics.json"])
    job.check_finite("seed=0", 1, {"train_loss": 1e308, "kl": -1e308, "test_loss": 0.0})


# --- one progress format, every family --------------------------------------------------------


@pytest.fixture
def progress_writes(monkeypatch) -> list[tuple[Path, dict[str, Any]]]:
    """Every progress file written (path, content), each write seen (no throttling)."""
    writes: list[tuple[Path, dict[str, Any]]] = []
    write = progress_module.write_progress

    def recording(path, *args, **kwargs):
        write(path, *args, **kwargs)
        writes.append((Path(path), json.loads(Path(path).read_text())))

    monkeypatch.setattr(progress_module, "write_progress", recording)
    monkeypatch.setattr(progress_module, "EVERY_S", 0.0)
    return writes


@pytest.fixture
def one_process_group(monkeypatch):
    """The environment torchrun gives a one-process DDP job, undone after the test, and the
    store its agent holds (bound to a port the OS gave it: no other process can take it)."""
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for name, value in {
        "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
        "TORCHELASTIC_USE_AGENT_STORE": "True", "OMP_NUM_THREADS": "1",
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    yield store  # held until the test ends


def run_ssvae(data: Path, folder: Path) -> Path:
    """Three epochs of two stacked SSVAE runs; the job's first output."""
    outs = [folder / "seed~0" / "metrics.json", folder / "seed~1" / "metrics.json"]
    train([Run("m2", 0.05, 0.0, 1.0, s) for s in (0, 1)], data, tiny(epochs=3), outs)
    return outs[0]


def run_scaling(data: Path, folder: Path) -> Path:
    """Two epochs of one-process DDP training (in this process); the job's first output."""
    argv = train_command(data, folder, settings(epochs=2), world=1)[1:]
    assert gpuflow_main(argv) == 0
    return folder / "run.json"


@pytest.fixture(scope="module")
def scaling_data(tmp_path_factory) -> Path:
    return prepare(tmp_path_factory.mktemp("scaling-data"))


def test_every_family_s_long_step_writes_the_one_progress_format(
    tmp_path,
    progress_writes,
    one_process_group,
    data_path,  # noqa: F811 (fixture)
    scaling_data,
    tiny_lm,  # noqa: F811 (fixture)
    texts,  # noqa: F811 (fixture)
):
    firsts = {
        "epochs (ssvae)": run_ssvae(data_path, tmp_path / "results" / "ssvae"),
        "epochs (scaling)": run_scaling(scaling_data, tmp_path / "results" / "scaling"),
    }
    shard = tmp_path / "results" / "sweep" / "shard~0.csv"
    argv = shard_command(shard, workers=1, seeds="0:2")[1:]
    quick = {**SHARD_SETTINGS, "gnc": {**SHARD_SETTINGS["gnc"], "max_guesses": 200}}
    argv[argv.index("--settings") + 1] = json.dumps(quick)
    assert gpuflow_main(argv) == 0
    firsts["seeds"] = shard
    scores = tmp_path / "results" / "fluency" / "shard~0.csv"
    assert gpuflow_main(perplexity_argv(texts, tiny_lm, scores, workers=1)) == 0
    firsts["tokens"] = scores
    by_path: dict[Path, list[dict[str, Any]]] = {}
    for path, record in progress_writes:
        by_path.setdefault(path, []).append(record)
    assert set(by_path) == {job_file(first, PROGRESS) for first in firsts.values()}
    for unit, first in firsts.items():
        records = by_path[job_file(first, PROGRESS)]
        assert all(list(r) == list(KEYS) for r in records), records
        assert {r["unit"] for r in records} == {unit.split()[0]}
        assert [r["resumed_at"] for r in records] == [0] * len(records)
        assert records[0]["done"] == 0 and records[-1]["done"] == records[-1]["total"] > 0
        assert not job_file(first, PROGRESS).exists(), "released with the outputs written"
        assert not list(first.parent.glob("*progress*")), "nothing beside the outputs"


# --- status reads the progress files, never a log ---------------------------------------------


Shown = tuple[float, float, str, float] | None


def printing_with_status(
    rule: str, first: Path, log: Path, reword: bool, shown: list[Shown]
) -> Callable[..., None]:
    """A `print` that writes each line the step prints to the job's `log` as well, and notes
    what `gpuflow status` shows for the job at that moment (in `shown`); with `reword`, each
    line says something else (reversed, prefixed) than the step wrote."""
    real_print = builtins.print
    job = PlannedJob(rule=rule, local=False, output=[str(first)], log=[str(log)])

    def printing(*args: Any, **kwargs: Any) -> None:
        if kwargs.get("file") is None:
            text = " ".join(str(a) for a in args)
            line = f"reworded: {text[::-1]}" if reword else text
            with open(log, "a", encoding="utf-8") as handle:
                handle.write(line + "\n")
            found = job_progress(job, "/")
            shown.append(
                None if found is None else (found.done, found.total, found.unit, found.resumed_at)
            )
            args = (line,)
        real_print(*args, **kwargs)

    return printing


@pytest.mark.parametrize("family", ["ssvae", "scaling"])
def test_rewording_every_training_log_line_leaves_gpuflow_status_unchanged(
    tmp_path,
    monkeypatch,
    one_process_group,
    family,
    data_path,  # noqa: F811 (fixture)
    scaling_data,
):
    monkeypatch.setattr(progress_module, "EVERY_S", 0.0)
    runs = {}
    for reword in (False, True):
        folder = tmp_path / ("reworded" if reword else "as-written") / "results" / family
        folder.mkdir(parents=True)
        if family == "ssvae":
            rule, first = "ssvae_train", folder / "seed~0" / "metrics.json"
        else:
            rule, first = "scaling_train", folder / "run.json"
        shown: list[Shown] = []
        log = folder / "train.log"
        printing = printing_with_status(rule, first, log, reword, shown)
        with monkeypatch.context() as patched:
            patched.setattr(builtins, "print", printing)
            if family == "ssvae":
                run_ssvae(data_path, folder)
            else:
                run_scaling(scaling_data, folder)
        runs[reword] = shown, log.read_text().splitlines()
    (as_written, lines), (reworded, other_lines) = runs[False], runs[True]
    assert len(lines) >= 2 and all(a != b for a, b in zip(lines, other_lines, strict=True))
    assert reworded == as_written
    assert all(seen is not None for seen in as_written), "status saw the progress at every line"
    assert [seen[1:] for seen in as_written] == [(as_written[0][1], "epochs", 0.0)] * len(lines)
    assert [seen[0] for seen in as_written] == sorted(seen[0] for seen in as_written)
    assert as_written[-1][0] >= as_written[-1][1] - 1, "the last epoch's line shows it nearly done"


def test_a_job_outside_gpuflow_names_the_same_files_and_locks_nothing(tmp_path):
    out = tmp_path / "results" / "sweep" / "shard~0.csv"
    bare = current([out])
    assert Job.active is None and bare.first_output == out
    units = bare.units(bare.state(), 3, "seeds", load=len, save=dict)
    assert (units.state.path, units.progress.path) == (
        job_file(out, STATE),
        job_file(out, PROGRESS),
    )
    assert not list(tmp_path.rglob("*.lock"))


@pytest.mark.parametrize(
    ("argv", "summary"),
    [
        (["fluency-merge", "--texts", "t.csv", "--perplexity", "p.csv", "--toxicity", "x.csv",
          "--out", "scores.csv", "--out-summary", "s.json", "--model-name", "m"], "s.json"),
        (["sweep-aggregate", "--shards", "a.csv", "--out", "runs.csv",
          "--out-summary", "means.csv"], "means.csv"),
    ],
)  # fmt: skip
def test_a_step_locks_every_output_it_writes_for_the_whole_job(argv, summary):
    """Outputs are the arguments the step's registration declares: the job holds their locks
    from start to end."""
    from gpuflow.cli import build_parser
    from gpuflow.job.outputlock import step_outputs

    assert Path(summary) in step_outputs(build_parser().parse_args(argv))


def test_every_step_declares_outputs_among_its_own_arguments():
    """A renamed flag the registration still names fails here, not by moving a job's files."""
    import argparse

    from gpuflow.cli import build_parser

    [steps] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name, parser in steps.choices.items():
        declared = parser.get_default("run").outputs
        assert set(declared) <= {action.dest for action in parser._actions}, name
        assert len(set(declared)) == len(declared), name
