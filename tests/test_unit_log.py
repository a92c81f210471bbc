"""A unit log, the resume state of a step whose units finish one by one (a sweep shard's seeds):
it keeps the finished units through a kill, is started over when it belongs to another run, and
tells what its earlier attempts spent."""

from __future__ import annotations

import json
from pathlib import Path

from gpuflow.job.paths import UNITS, job_file
from gpuflow.job.state import make_fingerprint
from gpuflow.job.unitlog import UnitLog

ONE, OTHER = make_fingerprint(settings={"a": 1}), make_fingerprint(settings={"a": 2})


def test_a_unit_log_keeps_finished_units_and_cuts_a_torn_last_line(tmp_path: Path):
    out = tmp_path / "shard~0.csv"
    path = job_file(out, UNITS)
    first = UnitLog(out, ONE).open()
    first.add_ok(0, {"seed": 0, "x": 0.5})
    first.add_failed(1, "boom")
    first.add_ok(2, {"seed": 2, "x": 0.25})  # the last whole line: kept with the others
    first.close()
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"kind": "unit", "unit": 3, "sta')  # killed mid-write
    again = UnitLog(out, ONE).open()
    assert not again.started_over
    assert again.done() == {0: {"seed": 0, "x": 0.5}, 2: {"seed": 2, "x": 0.25}}
    assert again.records[1]["error"] == "boom"
    again.add_ok(3, {"seed": 3})
    again.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line.get("unit") for line in lines] == [None, 0, 1, 2, 3]


def test_a_reopened_unit_log_carries_the_seconds_its_earlier_attempts_spent(tmp_path: Path):
    out = tmp_path / "shard~0.csv"
    first = UnitLog(out, ONE).open()
    first.started -= 30  # this attempt has run for 30 s when its units finish
    first.add_ok(0, {"seed": 0})
    first.add_failed(1, "boom")
    first.close()
    again = UnitLog(out, ONE).open()
    assert 30 <= again.earlier_s < 31, "the seconds up to the last unit line, failed or not"
    again.add_ok(1, {"seed": 1})
    again.close()
    last = json.loads(job_file(out, UNITS).read_text().splitlines()[-1])
    assert again.earlier_s <= last["elapsed_s"] < again.earlier_s + 1


def test_a_unit_log_of_another_fingerprint_is_started_over_and_holds_no_work(tmp_path: Path):
    out = tmp_path / "shard~0.csv"
    first = UnitLog(out, ONE).open()
    first.started -= 30
    first.add_ok(0, {"seed": 0})
    first.close()
    second = UnitLog(out, OTHER).open()
    second.close()
    assert second.started_over and second.done() == {} and second.earlier_s == 0
    assert second.reason == "written for other inputs, settings or gpuflow version"


def test_an_older_gpuflow_s_seed_log_is_removed_with_one_line(tmp_path: Path, capsys):
    out = tmp_path / "shard~0.csv"
    legacy = job_file(out, UNITS).with_name("shard~0.csv.seeds.jsonl")
    legacy.parent.mkdir(parents=True)
    legacy.write_text('{"kind": "header", "settings": {"a": 1}, "version": "0.9"}\n')
    log = UnitLog(out, ONE).open()
    log.close()
    assert not legacy.exists() and log.done() == {}
    assert capsys.readouterr().out == (
        f"ignoring {legacy}: a seed log of an older gpuflow; starting over\n"
    )
