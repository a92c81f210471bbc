"""What a job costs: its work from its inputs and settings, its time at measured rates, the
limit `runtime: auto` asks for, and earlier times scaled by the work they measured."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from gpuflow.cost.limits import Policy, limit_minutes
from gpuflow.cost.models import planned_work
from gpuflow.cost.predict import Missing, Prediction, from_benchmarks, predict
from gpuflow.cost.rates import INTERCONNECT, Rate, RateBook, StandIn, books
from gpuflow.cost.records import rate_field
from gpuflow.settings.validate import load_config
from gpuflow.ssvae.flops import forward_flops, m2_parameters, matmul_shapes
from gpuflow.ssvae.flops import train_flops_per_example as m2_flops
from gpuflow.ssvae.work import shape as ssvae_shape
from gpuflow.work import STARTUP, Term, Work
from tests.conftest import REPO

EMBEDDED = REPO / "config" / "config.yaml"


def rate(kind: str, shape: str, per_second: float, device: str = "cpu-test") -> Rate:
    return Rate(kind, shape, per_second, per_second, per_second, "", "test", device)


def ssvae_config(epochs: int, seeds: list[int], stack: str = "seeds") -> dict:
    config = load_config(EMBEDDED)
    config["ssvae"]["grid"]["seeds"] = seeds
    config["ssvae"]["model"] = {"hidden": 16, "latent": 4}
    config["ssvae"]["train"].update(epochs=epochs, eval_frequency=2, stack=stack)
    return config


POINT = {"frac": "0.025", "corrupt": "0.0", "alpha": "40"}


def test_a_job_s_time_is_its_start_up_and_each_term_over_its_rate():
    """The embedded digits: 4,000 to train on, 1,000 to test; 100 labels (2.5%), so 3,900
    unlabelled digits make 39 steps of 100 unlabelled and 50 labelled digits per run."""
    work = planned_work("ssvae_train", ssvae_config(epochs=4, seeds=[0, 1, 2]), POINT)
    at = ssvae_shape("m2", 16, 4, 3, 100, 50)
    book = RateBook(
        "cpu-test",
        [
            rate(STARTUP, "gpuflow.ssvae.train", 0.5),  # 2 s
            rate("ssvae.m2.flop", at, 1e9),
            rate("state.write", "", 1e8),
        ],
    )
    train = 4 * 39 * 3 * 150 * m2_flops(16, 4, 100, 50)  # epochs x steps x runs x examples
    evaluate = 2 * 3 * 1000 * forward_flops(matmul_shapes(16, 4, 1, 1, 1))  # epochs 2 and 4
    states = 4 * 3 * (3 * 4 * m2_parameters(16, 4))  # after every epoch: weights + 2 moments
    expected = 2 + (train + evaluate) / 1e9 + states / 1e8
    predicted = predict(work, book)
    assert isinstance(predicted, Prediction) and predicted.source == "w"
    assert predicted.seconds == pytest.approx(expected, rel=1e-9)
    assert predicted.startup == pytest.approx(2)
    assert (work.units, work.unit) == (4, "epochs")


def test_twice_the_epochs_or_the_stacked_runs_is_twice_the_computation():
    def computed(config: dict) -> float:
        work = planned_work("ssvae_train", config, POINT)
        return sum(t.amount for t in work.terms if t.kind == "ssvae.m2.flop")

    base = computed(ssvae_config(epochs=4, seeds=[0, 1]))
    assert computed(ssvae_config(epochs=8, seeds=[0, 1])) == pytest.approx(2 * base)
    assert computed(ssvae_config(epochs=4, seeds=[0, 1, 2, 3])) == pytest.approx(2 * base)
    assert computed(ssvae_config(epochs=4, seeds=[0, 1], stack="none")) == pytest.approx(base / 2)


def test_a_wrong_rate_is_a_wrong_time_and_a_missing_one_is_named():
    work = Work((Term(STARTUP, 1, "m"), Term("k.flop", 1e12, "s1"), Term("state.write", 1e9, "")))
    right = RateBook(
        "d", [rate(STARTUP, "m", 1.0), rate("k.flop", "s1", 1e11), rate("state.write", "", 1e9)]
    )
    slow = RateBook(
        "d", [rate(STARTUP, "m", 1.0), rate("k.flop", "s1", 5e10), rate("state.write", "", 1e9)]
    )
    assert predict(work, right).seconds == pytest.approx(1 + 10 + 1)
    assert predict(work, slow).seconds == pytest.approx(1 + 20 + 1)
    missing = predict(work, RateBook("gpu-x", [rate(STARTUP, "m", 1.0)]))
    assert isinstance(missing, Missing) and missing.kinds == ("k.flop at s1",)
    host_unmeasured = predict(work, RateBook("gpu-x", [rate("k.flop", "s1", 1e11)]))
    assert host_unmeasured.seconds == pytest.approx(10), "start-up and state writes left out"
    assert "startup, state.write not measured on gpu-x: left out" in host_unmeasured.notes


def test_work_shared_by_devices_and_a_rate_of_another_shape_are_said():
    work = Work((Term("k.flop", 8e11, "b16", parallel=4),))
    predicted = predict(work, RateBook("d", [rate("k.flop", "b32", 1e11)]))
    assert predicted.seconds == pytest.approx(2.0), "8e11 FLOP over 4 devices at 1e11 each"
    assert predicted.stand_ins == (StandIn("k.flop", "b32", "b16"),)


def test_scaling_runs_split_training_over_processes_and_all_reduce_their_gradients():
    config = load_config(EMBEDDED)
    one = planned_work("scaling_train", config, {"cfg": "short", "world": "1"})
    two = planned_work("scaling_train", config, {"cfg": "short", "world": "2"})
    assert {t.kind for t in one.terms} == {STARTUP, "scaling.train.flop", "state.write"}
    assert "allreduce.bytes" in {t.kind for t in two.terms}
    train_one, train_two = (
        next(t for t in w.terms if t.kind == "scaling.train.flop") for w in (one, two)
    )
    assert train_two.parallel == 2 and train_one.parallel == 1
    assert train_one.what.startswith("3 epochs x ")


def test_the_auto_limit_never_exceeds_the_partition_and_never_drops_below_warning_and_a_unit():
    """Below the limit: the start-up, the prediction x margin, the warning and the minute by
    which SLURM may send it early, and one epoch past it."""
    policy = Policy(margin=1.5, startup_minutes=2, warning_minutes=10, cap_minutes=600)
    work = Work((Term("k", 1.0),), units=10, unit="epochs")

    def limit(seconds: float, startup: float = 0.0) -> int:
        return limit_minutes(
            Prediction(seconds, seconds, seconds, "w", startup=startup), work, policy
        )

    # 20 min of 10 epochs: 2 + 30 (x1.5) + 10 + 1 (warning, early) + 2 (an epoch), rounded up
    assert limit(1200) == 45
    assert limit(1) == math.ceil(2 + 1.5 / 60 + 10 + 1 + 0.1 / 60)
    for seconds in (0.0, 1.0, 60.0, 3600.0, 36_000.0, 3.6e6):
        assert limit(seconds) <= 600
        assert limit(seconds) >= 2 + 11 + seconds / 10 / 60 or limit(seconds) == 600
    assert limit(3.6e6) == 600, "a thousand hours asks for the partition's limit"
    no_cap = Policy(margin=1.0, startup_minutes=0, warning_minutes=0, cap_minutes=None)
    assert limit_minutes(Prediction(90, 90, 90, "w"), work, no_cap) == 2, "no warning, no early"
    assert limit_minutes(None, None, no_cap) == no_cap.unknown_minutes, "no prediction"


def test_benchmarks_of_the_same_params_on_other_inputs_are_scaled_by_the_work_they_measured():
    """A job planned on half the digits of a benchmarked one: half its steps, so half the time
    (the start-up aside); with the same work, the benchmark as it is."""
    book = RateBook("cpu-test", [rate(STARTUP, "gpuflow.ssvae.train", 1.0)])
    config = ssvae_config(epochs=4, seeds=[0, 1])
    half = ssvae_config(epochs=4, seeds=[0, 1])
    half["ssvae"]["data"]["test_fraction"] = 0.6  # 2,000 training digits, not 4,000
    measured = planned_work("ssvae_train", config, POINT)
    planned = planned_work("ssvae_train", half, POINT)
    steps = [
        next(t for t in w.terms if t.kind == "ssvae.m2.flop").what for w in (measured, planned)
    ]
    assert "x 39 steps x" in steps[0] and "x 19 steps x" in steps[1]
    same = from_benchmarks([(30.0, measured)], measured, book, "b", "bench")
    scaled = from_benchmarks([(30.0, measured)], planned, book, "b", "bench")
    assert same.seconds == pytest.approx(30.0)
    main = [
        next(t.amount for t in w.terms if t.kind == "ssvae.m2.flop") for w in (measured, planned)
    ]
    assert scaled.seconds == pytest.approx(30.0 * main[1] / main[0])
    assert scaled.seconds < 16, "not the 30 s of twice the digits"


def test_rates_come_from_the_newest_record_row_that_measured_them(tmp_path):
    def record(created: str, value: float, device: str) -> dict:
        trials = [value, 2 * value, 3 * value]
        rows = [{"path": "a trial", "rate": rate_field("k.flop", "s", "FLOP/s", trials)}]
        rows.append({"path": "no rate here"})
        return {"created": created, "device_class": device, "rows": rows}

    h100, a100 = "nvidia-h100-80gb-hbm3", "nvidia-a100-sxm4-40gb"
    (tmp_path / "2026-01-01-nvidia-h100-80gb-hbm3.json").write_text(
        json.dumps(record("2026-01-01T10:00:00", 1.0, h100))
    )
    (tmp_path / "2026-01-01-nvidia-h100-80gb-hbm3-ssvae.json").write_text(
        json.dumps(record("2026-01-01T12:00:00", 5.0, h100))
    )
    (tmp_path / "2026-01-02-nvidia-a100-sxm4-40gb-rates.json").write_text(
        json.dumps(record("2026-01-02T00:00:00", 9.0, a100))
    )
    _, h100 = books(tmp_path, "h100")
    found, note = h100.find("k.flop", "s")
    assert (found.value, found.low, found.high, note) == (10.0, 5.0, 15.0, None)
    assert found.source == "2026-01-01-nvidia-h100-80gb-hbm3-ssvae.json", "the later of a day"
    assert books(tmp_path)[1].device == "nvidia-a100-sxm4-40gb", "the newest GPU by default"


def forget_counts() -> None:
    """What a new process knows of earlier counts: only the run folder's."""
    from gpuflow import work
    from gpuflow.fluency import work as fluency_work
    from gpuflow.scaling import work as scaling_work

    work._counted.clear()
    work.file_facts.cache_clear()
    fluency_work._texts.cache_clear()
    fluency_work.folder_lm.cache_clear()
    scaling_work._splits.cache_clear()
    scaling_work._tokens.cache_clear()


def refuse(*_: object, **__: object) -> None:
    raise AssertionError("the inputs were read or tokenised again")


def test_work_is_counted_once_and_read_back_until_an_input_changes(tmp_path, monkeypatch):
    """Snakemake counts every job's work while it builds the DAG, in every dry run, `gpuflow
    status` and `plan` and in each SLURM job's Snakemake: a later process reads the texts' and
    the splits' counts back from the run folder instead of reading and tokenising again, until
    an input file changes."""
    from gpuflow.fluency import lm_tokens, texts
    from gpuflow.scaling import data, tokens

    monkeypatch.chdir(tmp_path)
    generations = tmp_path / "generations.csv"
    lines = [
        f"g{i},{'a fairly fluent sentence number ' * (1 + i % 5)}{i},m{i % 2}" for i in range(60)
    ]
    generations.write_text("text_id,text,method\n" + "\n".join(lines) + "\n")
    config = load_config(EMBEDDED)
    config["fluency"]["texts"].update(
        source="files", files=[str(generations)], text_column="text", id_column="text_id",
        group_columns=["method"],
    )  # fmt: skip
    jobs = [
        ("fluency_perplexity", {"shard": "1"}),
        ("fluency_toxicity", {"shard": "0"}),
        ("fluency_train_lm", {}),
        ("scaling_train", {"cfg": "short", "world": "2"}),
        ("scaling_baseline", {"cfg": "short"}),
    ]
    first = [planned_work(rule, config, wildcards) for rule, wildcards in jobs]
    assert all(first) and list((tmp_path / ".snakemake" / "gpuflow" / "counts").iterdir())
    forget_counts()
    for module, name in (
        (texts, "selected_texts"), (lm_tokens, "train_bpe"), (data, "build_splits"),
        (tokens, "train_tokenizer"),
    ):  # fmt: skip
        monkeypatch.setattr(module, name, refuse)
    assert [planned_work(rule, config, wildcards) for rule, wildcards in jobs] == first
    generations.write_text(generations.read_text() + "g60,one more text,m0\n")
    forget_counts()
    with pytest.raises(AssertionError, match="read or tokenised again"):
        planned_work("fluency_toxicity", config, {"shard": "0"})


def test_counting_a_training_job_s_tokens_counts_its_baseline_s_texts_too(tmp_path, monkeypatch):
    """A dry run counts scaling_train's work (`runtime: auto`), not scaling_baseline's, which
    `gpuflow status` and `plan` ask for: the splits, built once for the first, count both (at
    paper scale a first status after a dry run took 11 s, 5 of them rebuilding the splits)."""
    from gpuflow.scaling import data

    monkeypatch.chdir(tmp_path)
    config = load_config(EMBEDDED)
    planned_work("scaling_train", config, {"cfg": "short", "world": "2"})
    forget_counts()
    monkeypatch.setattr(data, "build_splits", refuse)
    assert planned_work("scaling_baseline", config, {"cfg": "short"})


def test_a_ddp_job_s_all_reduce_is_measured_else_the_site_s_bandwidth_else_named_missing():
    """Four GPUs all-reduce a step's gradients: at a rate `gpuflow calibrate` measured on a node
    of four GPUs (`w`), else at the site file's NCCL bus bandwidth (a ring moves 2 (n - 1) / n
    of the buffer through each link; `s`: a datasheet figure, not a measurement), else no
    prediction: the missing rate is named, with how to get one."""
    from gpuflow.cost.expected import missing_reason

    config = load_config(EMBEDDED)
    config["scaling"]["device"] = "cuda"
    config["scaling"]["resources"]["scaling_train"]["gpu"] = 1
    work = planned_work("scaling_train", config, {"cfg": "short", "world": "4"})
    reduce = next(t for t in work.terms if t.kind == "allreduce.bytes")
    train = [t for t in work.terms if t.kind == "scaling.train.flop"]
    assert reduce.shape == "nccl x4 n1" and all(t.parallel == 4 for t in train)
    step = rate("scaling.train.flop", train[0].shape, 1e12, "h100")
    compute = sum(t.amount / 4 for t in train) / 1e12
    missing = predict(work, RateBook("h100", [step]))
    assert isinstance(missing, Missing) and missing.kinds == ("allreduce.bytes at nccl x4 n1",)
    reason = missing_reason(missing, RateBook("h100", [step]))
    assert "no allreduce.bytes rate on h100" in reason and "interconnect" in reason
    site = {"within_node": 450.0, "between_nodes": 50.0}
    datasheet = predict(work, RateBook("h100", [step], site))
    assert datasheet.source == "s" and INTERCONNECT in datasheet.basis
    assert datasheet.seconds == pytest.approx(compute + reduce.amount * 2 * 3 / 4 / 450e9)
    measured = rate("allreduce.bytes", "nccl x4 n1", 1e11, "h100")
    calibrated = predict(work, RateBook("h100", [step, measured], site))
    assert calibrated.source == "w" and calibrated.seconds == pytest.approx(
        compute + reduce.amount / 1e11
    )
    config["scaling"]["multinode"] = {"enabled": True, "nodes": 2, "gpus_per_node": 4, "port": 1}
    two_nodes = planned_work("scaling_train_multinode", config, {"cfg": "short"})
    spread = next(t for t in two_nodes.terms if t.kind == "allreduce.bytes")
    assert spread.shape == "nccl x8 n2"
    over = predict(two_nodes, RateBook("h100", [step, measured], site))
    eight = sum(t.amount / 8 for t in two_nodes.terms if t.kind == "scaling.train.flop") / 1e12
    assert over.source == "s", "a measurement on one node says nothing of two"
    assert over.seconds == pytest.approx(eight + spread.amount * 2 * 7 / 8 / 50e9)


def test_a_perplexity_shard_s_forward_passes_are_shared_by_its_workers():
    config = load_config(EMBEDDED)
    one = planned_work("fluency_perplexity", config, {"shard": "0"})
    config["fluency"]["cpu_workers"] = 2
    two = planned_work("fluency_perplexity", config, {"shard": "0"})
    config["fluency"].update(device="cuda", resources={**config["fluency"]["resources"]})
    config["fluency"]["resources"]["fluency_perplexity"] = {
        **config["fluency"]["resources"]["fluency_perplexity"], "gpu": 4,
    }  # fmt: skip
    four = planned_work("fluency_perplexity", config, {"shard": "0"})
    forward = [next(t for t in w.terms if t.kind == "lm.forward.flop") for w in (one, two, four)]
    assert [t.parallel for t in forward] == [1, 2, 4]
    assert forward[0].amount == forward[1].amount == forward[2].amount
    book = RateBook("d", [rate("lm.forward.flop", forward[0].shape, 1e9)])
    assert predict(Work((forward[1],)), book).seconds == pytest.approx(
        predict(Work((forward[0],)), book).seconds / 2
    )


def imported_with(shape: str) -> set[str]:
    """The modules a fresh interpreter holds once it has imported a start-up shape's modules."""
    code = f"import sys, {', '.join(shape.split('+'))}; print(*sys.modules)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(found.stdout.split())


def test_a_sweep_shard_s_priced_start_ups_import_torch_as_its_processes_do():
    """A start-up is timed by importing its shape. A shard's process imports torch (its devices,
    its seeds), so its shapes must too, or the plan prices a bare Python start (0.4 s for 2.9)."""
    wildcards = {"method": "gd", "rank": "2", "width": "4", "shard": "0"}
    work = planned_work("sweep_shard", load_config(EMBEDDED), wildcards)
    shapes = [term.shape for term in work.terms if term.kind == STARTUP]
    assert shapes
    for shape in shapes:
        assert imported_with(shape) & {"torch"}, shape


@pytest.mark.parametrize(
    ("rule", "wildcards", "trainer"),
    [
        ("ssvae_train", POINT, "gpuflow.ssvae.train"),
        ("ssvae_baseline", {"frac": "0.025", "corrupt": "0.0"}, "gpuflow.ssvae.train"),
        ("fluency_train_lm", {}, "gpuflow.fluency.train_lm"),
    ],
)
def test_a_training_job_s_priced_start_up_imports_what_building_its_optimizer_imports(
    rule, wildcards, trainer
):
    """Building a torch optimizer imports torch._dynamo (about 2 CPU-s on these machines). The
    start-up of the process that trains is timed by importing its shape, so the shape must
    import it too, or every training job is priced that much short (a baseline job: 6.5 s
    predicted for 9-12 s)."""
    work = planned_work(rule, load_config(EMBEDDED), wildcards)
    [shape] = [t.shape for t in work.terms if t.kind == STARTUP and trainer in t.shape.split("+")]
    assert imported_with(shape) & {"torch._dynamo"}, shape


def test_an_earlier_job_stands_for_another_by_the_ratio_of_their_predicted_times():
    """With a rate for every term, an earlier job's seconds are scaled by the ratio of the two
    jobs' predicted times, start-up included: 42 s for 1 + 20 s of work predicts 42 x 11 / 21
    for 1 + 10 s, not 42 x 10 / 20."""
    book = RateBook("d", [rate(STARTUP, "m", 1.0), rate("k.flop", "s", 1e9)])
    ran = Work((Term(STARTUP, 1, "m"), Term("k.flop", 20e9, "s")))
    planned = Work((Term(STARTUP, 1, "m"), Term("k.flop", 10e9, "s")))
    scaled = from_benchmarks([(42.0, ran)], planned, book, "m", "day-timings.json")
    assert scaled.source == "m" and scaled.seconds == pytest.approx(42 * 11 / 21)


def test_a_folder_s_facts_change_when_a_file_is_added_removed_or_replaced(tmp_path):
    """A folder of inputs (aclImdb's 50,000 reviews) is told apart without a stat per file: a
    review added, removed or replaced (written beside it, then renamed over it) is seen."""
    from gpuflow.work import file_facts

    reviews = tmp_path / "train" / "pos"
    reviews.mkdir(parents=True)
    for index in range(3):
        (reviews / f"{index}_9.txt").write_text(f"review {index}")

    def facts() -> str:
        file_facts.cache_clear()
        return file_facts("train", str(tmp_path))

    seen = [facts()]
    (reviews / "3_9.txt").write_text("one more")
    seen.append(facts())
    (reviews / "0_9.txt").unlink()
    seen.append(facts())
    (reviews / "new.tmp").write_text("another review")
    (reviews / "new.tmp").rename(reviews / "1_9.txt")
    seen.append(facts())
    assert len(set(seen)) == 4
    assert facts() == seen[-1], "nothing changed: the same facts"
