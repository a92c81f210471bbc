"""`gpuflow plan`: jobs, GPU-hours and submissions read from the dry run, before any spend."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import yaml
from snakemake.jobs import Reason

from gpuflow.cost.benchmarks import benchmark_seconds
from gpuflow.cost.expected import size_of
from gpuflow.cost.limits import WARNING_EARLY_MINUTES
from gpuflow.cost.rates import StandIn
from gpuflow.cost.records import this_cpu
from gpuflow.errors import GpuflowError
from gpuflow.job.paths import RECORD, job_file
from gpuflow.ops import snakemake_adapter
from gpuflow.ops.plan import Job, plan_jobs, source_lines
from gpuflow.ops.snakemake_adapter import (
    SUPPORTED,
    check_version,
    params_digest,
    snakemake_version,
    why_it_runs,
)
from gpuflow.slurm.site import SITE_ENV
from tests.conftest import BIN, tiny_config, workflow_env

REPO = Path(__file__).resolve().parents[1]
SNAKEFILE = REPO / "tests" / "slurm" / "Snakefile"


def write_probe_config(workdir: Path, n_gpu_jobs: int = 5) -> Path:
    config = {
        "probe": {
            "n_gpu_jobs": n_gpu_jobs,
            "hold": 0,
            "kill_hold": 0,
            "seed": 0,
            "resources": {
                "probe_gpu": {"gpu": 1, "cpus_per_gpu": 2, "mem_mb": 1000, "runtime": 30},
                "probe_cpu": {"gpu": 0, "cpus_per_task": 1, "mem_mb": 500, "runtime": 5},
                "probe_retried": {"gpu": 4, "cpus_per_gpu": 1, "mem_mb": 700, "runtime": 120},
            },
        }
    }
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def plan(run_gpuflow, workdir: Path, *args: str) -> dict[str, dict]:
    config = write_probe_config(workdir)
    result = run_gpuflow(
        "plan", "--json", "--snakefile", str(SNAKEFILE), "--directory", str(workdir),
        "--configfile", str(config), *args,
    )  # fmt: skip
    return {row["rule"]: row for row in json.loads(result.stdout)}


def test_gpu_hours_requested_are_gpus_times_runtime(run_gpuflow, tmp_path):
    rows = plan(run_gpuflow, tmp_path)
    assert rows["probe_gpu"]["jobs"] == 5
    assert rows["probe_gpu"]["gpus_per_job"] == "1"
    assert rows["probe_gpu"]["gpu_h_requested"] == pytest.approx(5 * 0.5)
    assert rows["probe_retried"]["gpu_h_requested"] == pytest.approx(4 * 2.0)
    assert rows["probe_cpu"]["gpu_h_requested"] == 0
    assert rows["probe_retried"]["node_h"] == pytest.approx(2.0), "4 GPUs = one node"


TIMED = """
rule all:
    input: expand('out/point~{p}.txt', p=config.get('points', [1, 2]))

rule train:
    output: 'out/point~{p}.txt'
    params: epochs=config['epochs'], point='{p}'
    benchmark: 'bench/point~{p}.tsv'
    resources: gpu=1, runtime=600
    shell: 'sleep 0.3; echo {params.epochs} > {output}'
"""

# A job sleeps 0.3 s; Snakemake's benchmark timer starts a little after the shell (0.28 s seen).
MEASURED_MIN_S = 0.2


def timed_workflow(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A Snakefile whose jobs' cost depends on a param (and another param names the job's
    point, its wildcard), and configs at 5 and 75 epochs."""
    snakefile = tmp_path / "Snakefile"
    snakefile.write_text(TIMED)
    configs = []
    for epochs in (5, 75):
        configs.append(tmp_path / f"epochs{epochs}.yaml")
        configs[-1].write_text(f"epochs: {epochs}\n")
    return snakefile, configs[0], configs[1]


def run_timed(snakefile: Path, config: Path, ran: Path) -> None:
    """The timed workflow run in `ran`, as on the GPU machine."""
    subprocess.run(
        [str(BIN / "snakemake"), "--snakefile", str(snakefile), "--directory", str(ran),
         "--configfile", str(config), "--cores", "2", "--quiet"],
        env=workflow_env(), check=True, capture_output=True,
    )  # fmt: skip


def record_timings(
    run_gpuflow, snakefile: Path, config: Path, ran: Path, out: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """`gpuflow record-timings` of the run in `ran`, into `out`."""
    return run_gpuflow(
        "record-timings", "--snakefile", str(snakefile), "--directory", str(ran),
        "--configfile", str(config), "--out", str(out), *args,
    )  # fmt: skip


def test_times_recorded_on_the_gpu_machine_plan_the_same_jobs_where_they_never_ran(
    run_gpuflow, tmp_path
):
    snakefile, five, seventy_five = timed_workflow(tmp_path)
    ran, records = tmp_path / "gpu-machine", tmp_path / "records"
    run_timed(snakefile, five, ran)
    done = record_timings(run_gpuflow, snakefile, five, ran, records)
    [written] = records.iterdir()
    assert written.name.endswith(f"-{this_cpu()}-timings.json"), done.stdout
    record = json.loads(written.read_text())
    jobs = {row["path"]: row["job"] for row in record["rows"]}
    assert set(jobs) == {"bench/point~1.tsv", "bench/point~2.tsv"}
    assert {job["rule"] for job in jobs.values()} == {"train"}
    assert [job["wildcards"] for job in jobs.values()] == [{"p": "1"}, {"p": "2"}]
    assert all(MEASURED_MIN_S <= job["seconds"] < 30 for job in jobs.values())
    assert record["devices"] == ["cpu"] and record["device_class"] == this_cpu()
    assert {"torch", "cuda", "commit", "created"} <= set(record)

    def record_as_h100() -> dict:
        h100 = ("--device", "NVIDIA H100 80GB HBM3")
        record_timings(run_gpuflow, snakefile, five, ran, records / "h100", *h100)
        [named] = (records / "h100").iterdir()
        assert named.name.endswith("-nvidia-h100-80gb-hbm3-timings.json")
        return json.loads(named.read_text()) | {"path": named}

    first = record_as_h100()
    assert first["devices"] == ["NVIDIA H100 80GB HBM3"]
    earlier = {"rule": "train", "wildcards": {"p": "9"}, "seconds": 9.0, "params": "earlier"}
    first["rows"].append({"path": "bench/other.tsv", "job": earlier})
    first["path"].write_text(json.dumps({k: v for k, v in first.items() if k != "path"}))
    again = record_as_h100()  # the same day and device: added to, not replaced
    assert {row["path"] for row in again["rows"]} == {"bench/other.tsv", *jobs}

    def plan_elsewhere(config: Path) -> dict:
        result = run_gpuflow(
            "plan", "--json", "--snakefile", str(snakefile), "--directory",
            str(tmp_path / "login-node"), "--configfile", str(config), "--timings", str(records),
        )  # fmt: skip
        return {row["rule"]: row for row in json.loads(result.stdout)}["train"]

    same = plan_elsewhere(five)
    assert same["from_record"] == written.name and same["from_benchmarks"] is False
    mean = sum(job["seconds"] for job in jobs.values()) / 2
    assert same["gpu_h_expected"] == pytest.approx(2 * mean / 3600)
    other = plan_elsewhere(seventy_five)  # measured at 5 epochs: says nothing of 75
    assert other["from_record"] is None and other["gpu_h_expected"] == pytest.approx(2 * 10)

    status = run_gpuflow(
        "status", "--json", "--snakefile", str(snakefile), "--directory",
        str(tmp_path / "login-node"), "--configfile", str(five), "--timings", str(records),
    )  # fmt: skip
    [train] = [row for row in json.loads(status.stdout)["rules"] if row["rule"] == "train"]
    assert train["todo"] == 2 and train["gpu_h_left"] == pytest.approx(2 * mean / 3600)


def test_the_folder_s_own_benchmarks_plan_jobs_of_the_same_params_with_earlier_attempts(
    run_gpuflow, tmp_path
):
    """Point 3 is new; points 1 and 2 ran at 5 epochs, point 1 resumed after an attempt that
    saved an hour (its job record says so, written from the resume state:
    tests/test_stopping.py; its benchmark covers its last attempt only). record-timings adds
    the hour. At 5 epochs the folder's times plan point 3, before a committed record's; at 75
    they say nothing, and all three jobs are planned from the rule's runtime. Status counts
    the hour among the GPU-hours spent."""
    snakefile, five, _ = timed_workflow(tmp_path)
    ran, records = tmp_path / "run", tmp_path / "records"
    run_timed(snakefile, five, ran)
    resumed = job_file(ran / "out" / "point~1.txt", RECORD)
    resumed.parent.mkdir(parents=True)
    resumed.write_text(json.dumps({"status": "finished", "timings": {"earlier_attempts_s": 3600}}))
    record_timings(run_gpuflow, snakefile, five, ran, records)
    [written] = records.iterdir()
    committed = json.loads(written.read_text())
    recorded_s = {row["path"]: row["job"]["seconds"] for row in committed["rows"]}
    assert 3600 + MEASURED_MIN_S <= recorded_s["bench/point~1.tsv"] < 3630
    assert MEASURED_MIN_S <= recorded_s["bench/point~2.tsv"] < 30
    for row in committed["rows"]:
        row["job"]["seconds"] = 99_999  # told apart from the folder's own
    written.write_text(json.dumps(committed))
    ran_s = [benchmark_seconds(ran / "bench" / f"point~{p}.tsv") or 0.0 for p in (1, 2)]

    def planned(epochs: int) -> dict:
        config = tmp_path / f"three-points-{epochs}.yaml"
        config.write_text(f"epochs: {epochs}\npoints: [1, 2, 3]\n")
        result = run_gpuflow(
            "plan", "--json", "--snakefile", str(snakefile), "--directory", str(ran),
            "--configfile", str(config), "--timings", str(records),
        )  # fmt: skip
        return {row["rule"]: row for row in json.loads(result.stdout)}["train"]

    same = planned(5)
    assert (same["jobs"], same["why"]) == (1, {"missing": 1})
    assert same["from_benchmarks"] is True and same["from_record"] is None
    assert same["expected_h_per_job"] == pytest.approx((ran_s[0] + 3600 + ran_s[1]) / 2 / 3600)
    other = planned(75)
    assert (other["jobs"], other["why"]) == (3, {"changed": 2, "missing": 1})
    assert other["from_benchmarks"] is False and other["from_record"] is None
    assert other["expected_h_per_job"] == pytest.approx(10)
    assert (same["benchmarks_other_params"], other["benchmarks_other_params"]) == (0, 2)
    status = run_gpuflow(
        "status", "--json", "--snakefile", str(snakefile), "--directory", str(ran),
        "--configfile", str(five),
    )  # fmt: skip
    [train] = [row for row in json.loads(status.stdout)["rules"] if row["rule"] == "train"]
    assert train["gpu_h_spent"] == pytest.approx((ran_s[0] + 3600 + ran_s[1]) / 3600, rel=1e-3)


def test_the_newest_record_of_a_rule_with_the_job_s_params_counts(run_gpuflow, tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    no_params = params_digest([])  # probe_gpu's jobs take none

    def job(gpu: int, seconds: float, params: str) -> dict:
        done = {"rule": "probe_gpu", "wildcards": {"gpu": str(gpu)}, "seconds": seconds}
        return {
            "path": f"results/probe/benchmarks/gpu~{gpu}.tsv",
            "job": {**done, "params": params},
        }

    h100 = {"device_class": "nvidia-h100-80gb-hbm3", "devices": ["cuda:0 (NVIDIA H100 80GB HBM3)"]}
    for day, seconds in (("2026-01-01", 720), ("2026-02-01", 1080)):
        record = {**h100, "created": day, "rows": [job(3, seconds, no_params), job(4, 1, "x")]}
        (records / f"{day}-nvidia-h100-80gb-hbm3-timings.json").write_text(json.dumps(record))
    (records / "2026-03-01-nvidia-h100-80gb-hbm3.json").write_text("{}")  # a gpu-check record
    no_class = {"rows": [job(3, 5, no_params)]}  # a record that says not where it was measured
    (records / "2026-03-02-a100-timings.json").write_text(json.dumps(no_class))
    (records / "2026-03-03-a100-timings.json").write_text("[1, 2]")
    (records / "2026-03-04-a100-timings.json").write_text('{"rows": null}')
    bad_job = {"device_class": "a100", "rows": [{"job": {"rule": "probe_gpu", "seconds": "5"}}]}
    (records / "2026-03-05-a100-timings.json").write_text(json.dumps(bad_job))
    config = write_probe_config(tmp_path / "run")
    text = run_gpuflow(
        "plan", "--snakefile", str(SNAKEFILE), "--directory", str(tmp_path / "run"),
        "--configfile", str(config), "--timings", str(records),
    ).stdout  # fmt: skip
    probe_gpu = next(line.split() for line in text.splitlines() if line.startswith("probe_gpu"))
    assert probe_gpu[3:6] == ["18.0", "min", "m"], "time per job 18.0 min, from a record"
    assert "m: 2026-02-01-nvidia-h100-80gb-hbm3-timings.json, measured on cuda:0 (NVIDIA" in text


def test_after_a_partial_failure_only_jobs_without_outputs_run_again(run_gpuflow, tmp_path):
    done = tmp_path / "results" / "probe"
    done.mkdir(parents=True)
    for name in ("gpu~0.json", "gpu~1.json", "cpu.json"):
        (done / name).write_text("{}")
    rows = plan(run_gpuflow, tmp_path)
    assert rows["probe_gpu"]["jobs"] == 3
    assert rows["probe_gpu"]["why"] == {"missing": 3}
    assert "probe_cpu" not in rows


def test_grid_rules_submitted_as_arrays_cost_one_sbatch(run_gpuflow, tmp_path):
    profile = str(REPO / "tests" / "slurm" / "profile")
    rows = plan(run_gpuflow, tmp_path, "--profile", "profiles/slurm", "--profile", profile)
    assert rows["probe_gpu"]["sbatch"] == 1
    assert rows["probe_retried"]["sbatch"] == 1


def test_jobs_that_fit_no_partition_or_end_within_their_stop_warning_are_listed(
    run_gpuflow, tmp_path
):
    """Against the profile's site file: 8 GPUs or 800 GB fit no partition; a GPU rule's limit of
    11 minutes leaves the 10-minute stop warning no time (SLURM sends it up to a minute early,
    so as the job starts)."""
    config = write_probe_config(tmp_path, n_gpu_jobs=2)
    probe = yaml.safe_load(config.read_text())
    probe["probe"]["resources"]["probe_gpu"]["gpu"] = 8
    probe["probe"]["resources"]["probe_cpu"]["mem_mb"] = 800000
    probe["probe"]["resources"]["probe_retried"]["runtime"] = 11
    config.write_text(yaml.safe_dump(probe))
    result = run_gpuflow(
        "plan", "--snakefile", str(SNAKEFILE), "--directory", str(tmp_path),
        "--profile", "profiles/slurm", "--configfile", str(config),
    )  # fmt: skip
    unfit = result.stdout.split("2 rule(s) ask for more than any partition")[1].splitlines()
    assert unfit[:3] == [
        f" of {REPO / 'profiles' / 'slurm' / 'site.yaml'} gives:",
        "  probe_gpu (i=0) asks gpu 8, cpus_per_gpu 2, mem_mb 1000, runtime 30; "
        "gpu_h100: max_gpu 4; genoa: max_gpu 0",
        "  probe_cpu asks cpus_per_task 1, mem_mb 800000, runtime 5; "
        "gpu_h100: max_mem_mb 720000; genoa: max_mem_mb 336000",
    ]
    unfit_block = result.stdout.split("ask for more")[1].split("ask for a time limit")[0]
    assert "probe_retried" not in unfit_block, "4 GPUs fit gpu_h100"
    short = result.stdout.split("1 GPU rule(s) ask for a time limit no longer than")[1]
    assert short.startswith(
        " the site's stop warning (10 min, sent up to 1 min early): probe_retried (11 min). "
    ), "30 minutes (probe_gpu) leave the warning 19; a CPU rule (probe_cpu, 5) saves nothing"


def test_the_table_has_a_row_per_rule_and_totals(run_gpuflow, tmp_path):
    config = write_probe_config(tmp_path)
    text = run_gpuflow(
        "plan", "--snakefile", str(SNAKEFILE), "--directory", str(tmp_path),
        "--configfile", str(config),
    ).stdout  # fmt: skip
    assert [line.split()[0] for line in text.splitlines()[2:5]] == [
        "probe_gpu", "probe_cpu", "probe_retried",
    ]  # fmt: skip
    total = next(line for line in text.splitlines() if line.startswith("total"))
    assert total.split()[1:3] == ["7", "10.50"]
    assert "Re-run after a partial failure: 7 jobs lack their outputs" in text


def plan_of(snakefile: Path, workdir: Path) -> argparse.Namespace:
    return argparse.Namespace(
        directory=str(workdir), profile=[], snakefile=str(snakefile), configfile=[], targets=[]
    )


def test_jobs_come_from_snakemake_records_with_wildcards_resources_and_reasons(tmp_path):
    (tmp_path / "Snakefile").write_text(
        "rule all:\n    input: 'frac~0.1/seed~1.json'\n\n"
        "rule train:\n    output: 'frac~{frac}/seed~{seed}.json'\n"
        "    benchmark: 'b/frac~{frac}/seed~{seed}.tsv'\n"
        "    resources: gpu=2, runtime=90\n    shell: 'touch {output}'\n"
    )
    jobs = {job.rule: job for job in plan_jobs(plan_of(tmp_path / "Snakefile", tmp_path)).jobs}
    train = jobs["train"]
    assert (train.gpus, train.runtime_h, train.why) == (2, 1.5, "missing")
    assert train.wildcards == {"frac": "0.1", "seed": "1"}
    assert train.benchmark == "b/frac~0.1/seed~1.tsv"
    assert size_of(train.wildcards) == 1, "an SSVAE epoch's time does not grow with its labels"
    assert size_of({"texts": "2000", "seed": "3"}) == 2000, "texts scale, seeds do not"
    assert (train.local, jobs["all"].local) == (False, True), "a rule without body is local"


def test_the_params_digest_leaves_out_only_string_params_naming_a_wildcard_value():
    """Snakemake serialises each param as its repr: a seed taken from the wildcard is "'3'"."""
    assert params_digest(["'3'", "5"], {"seed": "3"}) == params_digest(["'4'", "5"], {"seed": "4"})
    assert params_digest(["'3'", "5"], {"seed": "3"}) != params_digest(["'3'", "75"], {"seed": "3"})
    world_4, world_2 = params_digest(["4", "x"], {"world": "4"}), params_digest(["2", "x"], {})
    assert world_4 != params_digest(["x"], {}) and world_4 != world_2, "a number stays"


def test_reasons_are_sorted_into_resume_changed_and_downstream():
    def why(incomplete: bool = False, **parts: set[str] | bool) -> str:
        reason = Reason()
        for name, value in parts.items():
            if isinstance(value, set):
                getattr(reason, name).update(value)  # Snakemake's file sets fill in place
            else:
                setattr(reason, name, value)
        return why_it_runs(reason, incomplete)

    assert why(missing_output={"x"}) == "missing"
    assert why(incomplete=True, forced=True) == "incomplete", "--rerun-incomplete forces them"
    assert why(incomplete=True, incomplete_output={"x"}) == "incomplete"
    assert why(forced=True) == "changed", "forced by the user, not left by a killed job"
    assert why(updated_input_run={"x"}) == "downstream"
    assert why(updated_input={"x"}, updated_input_run={"y"}) == "changed"
    assert why(params_changed=True) == "changed"


def test_the_adapter_names_the_snakemake_it_supports_and_stops_on_another(monkeypatch, tmp_path):
    installed = snakemake_version()
    assert ".".join(installed.split(".")[:2]) in SUPPORTED == ("9.27",)
    check_version()
    with pytest.raises(GpuflowError) as stopped:
        check_version("9.26.3")
    assert str(stopped.value) == (
        "gpuflow's Snakemake adapter supports Snakemake 9.27.x, found 9.26.3: "
        "install a supported one (pip install 'snakemake==9.27.*')"
    )
    monkeypatch.setattr(snakemake_adapter, "snakemake_version", lambda: "10.0.0")
    (tmp_path / "Snakefile").write_text("rule a:\n    output: 'a'\n    shell: 'touch a'\n")
    with pytest.raises(GpuflowError, match=r"found 10\.0\.0"):
        plan_jobs(plan_of(tmp_path / "Snakefile", tmp_path))


def test_a_two_node_job_counts_every_gpu_of_both_nodes():
    job = Job(
        rule="train_multinode",
        local=False,
        resources={"nodes": 2, "tasks": 2, "gres": "gpu:4", "runtime": 60},
    )
    assert job.gpus == 8
    assert replace(job, resources={**job.resources, "gres": "gpu:h100:4"}).gpus == 8
    assert job.runtime_h == 1.0


def test_rows_follow_the_order_rules_are_defined_in_through_includes(tmp_path):
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "b.smk").write_text(
        "localrules: second\n\nrule second:\n    output: 'b'\n    shell: 'touch b'\n"
    )
    (tmp_path / "Snakefile").write_text(
        "rule all:\n    input: 'a', 'b', 'c'\n\n"
        "rule first:\n    output: 'a'\n    shell: 'touch a'\n\ninclude: 'rules/b.smk'\n\n"
        "if True:\n\n    rule third:\n        output: 'c'\n        shell: 'touch c'\n"
    )
    planned = plan_jobs(plan_of(tmp_path / "Snakefile", tmp_path))
    assert planned.rule_order == ["all", "first", "second", "third"]
    assert {job.rule for job in planned.jobs if job.local} == {"all", "second"}


def test_the_plan_shows_what_earlier_jobs_of_a_rule_used_and_flags_low_use(run_gpuflow, tmp_path):
    earlier = tmp_path / "results" / "probe" / "gpu~7.json"  # a job of another grid
    runtime = json.dumps({"telemetry": {"interval_s": 0.1}})
    run_gpuflow("probe", "--hold", "2", "--out", str(earlier), "--runtime", runtime)  # mostly idle
    recorded = json.loads(job_file(earlier, RECORD).read_text())
    rows = plan(run_gpuflow, tmp_path)
    seen = rows["probe_gpu"]["telemetry"]
    assert seen["jobs_measured"] == 1 and seen["util_kind"] == "cpu"
    assert seen["util_mean"] == pytest.approx(recorded["cpu"]["util_percent_mean"])
    assert recorded["cpu"]["util_percent_mean"] < 50
    assert seen["flag"] == "LOW: no timing of the job explains it"
    assert seen["gpu_h_used"] == 0
    assert rows["probe_cpu"]["telemetry"]["jobs_measured"] == 0


def paper_plan(hf_home: Path) -> str:
    """`gpuflow plan` of config/paper.yaml under the SLURM profile, in-process, and whether it
    imported torch (its last line)."""
    code = (
        "import sys; from gpuflow.cli import main; "
        "main(['plan', '--profile', 'profiles/slurm', '--configfile', 'config/paper.yaml']); "
        "print('torch imported:', 'torch' in sys.modules)"
    )
    env = {**workflow_env(), "HF_HOME": str(hf_home)}  # an empty Hugging Face cache
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_the_paper_plan_on_slurm_fits_the_example_site_and_imports_no_torch(tmp_path):
    """The plan stays as quick as a dry run: the placement line alone would import torch. Every
    job of the paper config fits a partition of the example site file."""
    out = paper_plan(tmp_path)
    assert "Perplexity placement: auto: model 'gpt2-large' is not readable here" in out
    assert "ask for more than any partition" not in out
    assert out.rstrip().endswith("torch imported: False")


def test_a_rule_whose_inputs_are_not_here_names_them_as_the_reason_for_its_limit(tmp_path):
    """Work is counted from a job's inputs: where the paper's texts, model and data are not on
    this machine, the plan falls back to the limit (`r`) and names what is missing."""
    out = paper_plan(tmp_path)
    block = out.split("\nSources:\n", 1)[1].split("\n\n", 1)[0]
    sources: dict[str, str] = {}
    for line in block.splitlines():  # each rule's source first, then notes on its benchmarks
        rule, _, source = line.partition(": ")
        sources.setdefault(rule, source)
    perplexity = "r (not here: data/fluency/generations.csv, model 'gpt2-large')"
    assert sources["fluency_perplexity"] == perplexity
    assert sources["fluency_toxicity"] == "r (not here: data/fluency/generations.csv)"
    assert sources["scaling_train"] == (
        "r (not here: data/scaling/aclImdb;"
        " not here: data/scaling/ag_news/train.csv, data/scaling/ag_news/test.csv)"
    )


def test_a_run_in_another_folder_reads_the_workflow_s_site_file(tmp_path):
    """`--directory` elsewhere changes where results go, not the site: every auto limit still
    holds the site's stop warning (without the site file, a limit is start-up and work alone)."""
    site = yaml.safe_load((REPO / "profiles" / "slurm" / "site.yaml").read_text())
    floor = site["stop_warning_minutes"] + WARNING_EARLY_MINUTES
    command = [str(BIN / "gpuflow"), "plan", "--json", "--profile", "profiles/slurm"]
    command += ["--configfile", "config/paper.yaml", "--directory", str(tmp_path / "run")]
    result = subprocess.run(command, cwd=REPO, env=workflow_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {row["rule"]: row for row in json.loads(result.stdout)}
    assert rows["ssvae_train"]["source"] == "m", "the committed H100 records plan it"
    assert min(rows["ssvae_train"]["limits_min"]) > floor
    assert rows["ssvae_train"]["units_expected"] > 0, "the site's charges count"


def test_a_rate_taken_for_other_shapes_is_said_once_per_rate():
    """The paper plan's 72 sweep shards take one cell's rates for 8 other cells each: the
    Sources line names each rate once, with how many shapes it stood in for."""
    stand_ins = [asdict(StandIn("sweep.gd.seed", "gd r8 w16", f"gd r{r} w4")) for r in (2, 4, 8)]
    row = {"rule": "sweep_shard", "local": False, "source": "w", "basis": ["day-rates.json"]}
    notes = ["startup not measured on x: left out"]
    lines = source_lines([{**row, "notes": notes, "stand_ins": stand_ins}])
    assert lines[2] == (
        "sweep_shard: w from day-rates.json (startup not measured on x: left out; "
        "sweep.gd.seed measured at gd r8 w16, taken for 3 other shapes (gd r2 w4, gd r4 w4, ...))"
    )
    [one] = source_lines([{**row, "notes": [], "stand_ins": stand_ins[:1]}])[2:]
    assert one.endswith("(sweep.gd.seed measured at gd r8 w16, not gd r2 w4)")


def test_whole_node_columns_count_each_job_s_gpus_and_charge_per_gpu_hour(run_gpuflow, tmp_path):
    """Under the SLURM profile and its example site (192 units a GPU-hour on gpu_h100), with 8
    GPUs to a node: a 4-GPU job of 2 hours is 8 GPU-hours, one node-hour and 1,536 units; five
    1-GPU jobs of half an hour are 2.5 GPU-hours, 0.3125 node-hours and 480 units."""
    rows = plan(run_gpuflow, tmp_path, "--profile", "profiles/slurm", "--gpus-per-node", "8")
    four, one = rows["probe_retried"], rows["probe_gpu"]
    assert (four["gpus_per_job"], four["source"], four["expected_h_per_job"]) == ("4", "r", 2.0)
    assert four["gpu_h_expected"] == pytest.approx(8.0) and four["node_h"] == pytest.approx(1.0)
    assert four["units_expected"] == pytest.approx(192 * 8.0)
    assert one["gpu_h_expected"] == pytest.approx(2.5) and one["node_h"] == pytest.approx(2.5 / 8)
    assert one["units_expected"] == pytest.approx(192 * 2.5)
    assert "units_expected" not in rows["probe_cpu"], "CPU partitions cost nothing here"


def test_a_plan_run_elsewhere_reads_the_inputs_in_the_run_s_folder(run_gpuflow, tmp_path):
    """`--directory RUN` from another folder: the texts the config names (relative paths) are
    read in RUN, as the Snakemake that builds the DAG reads them; the source a row prints is
    the one its limit came from."""
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    (run / "data").mkdir(parents=True)
    elsewhere.mkdir()
    lines = [f"t{i},a short text number {i} of the run,m{i % 2}" for i in range(30)]
    (run / "data" / "texts.csv").write_text("text_id,text,method\n" + "\n".join(lines) + "\n")
    config = tiny_config("all")
    config["families"] = ["fluency"]
    config["fluency"]["texts"] = {
        "source": "files", "files": ["data/texts.csv"], "text_column": "text",
        "id_column": "text_id", "group_columns": ["method"],
    }  # fmt: skip
    configfile = run / "config.yaml"
    configfile.write_text(json.dumps(config))
    done = subprocess.run(
        [str(BIN / "gpuflow"), "plan", "--snakefile", str(REPO / "Snakefile"), "--directory",
         str(run), "--configfile", str(configfile), "--timings", str(tmp_path / "no-records")],
        cwd=elsewhere, env=workflow_env(), capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    toxicity = next(line for line in done.splitlines() if line.startswith("fluency_toxicity: "))
    assert toxicity == (
        "fluency_toxicity: r (no toxicity.bytes rate here: run `gpuflow calibrate` with this"
        " config)"
    ), "counted in RUN: what is missing is a rate, not the texts"
    assert (run / ".snakemake" / "gpuflow" / "counts").is_dir()
    assert not (elsewhere / ".snakemake").exists()


def ddp_plan(tmp_path: Path, interconnect: dict | None) -> dict[str, str]:
    """Of the plan of the embedded scaling runs on 1, 2 and 4 GPUs under the SLURM profile,
    with a GPU record of their training step and a site file with `interconnect`: the
    scaling_train row's source, its Sources line and the line under the totals."""
    config = tiny_config("all")
    config["families"] = ["scaling"]
    config["scaling"].update(device="cuda", world_sizes=[1, 2, 4], run=["short"])
    config["scaling"]["resources"] = {"scaling_train": {"gpu": 1, "runtime": "auto"}}
    tmp_path.mkdir()
    configfile = tmp_path / "config.yaml"
    configfile.write_text(json.dumps(config))
    site = yaml.safe_load((REPO / "profiles" / "slurm" / "site.yaml").read_text())
    site["interconnect"] = interconnect
    (tmp_path / "site.yaml").write_text(yaml.safe_dump(site))
    records = tmp_path / "records"
    records.mkdir(exist_ok=True)
    step = {"kind": "scaling.train.flop", "shape": "d48 L1 ffn96 seq48 b16 bf16", "unit": "FLOP/s"}
    record = {"device_class": "nvidia-h100-80gb-hbm3", "created": "2026-01-01", "rows": [
        {"path": "a step", "rate": {**step, "value": 1e12, "trials": [1e12]}}]}  # fmt: skip
    (records / "2026-01-01-nvidia-h100-80gb-hbm3-rates.json").write_text(json.dumps(record))
    env = {**workflow_env(), SITE_ENV: str(tmp_path / "site.yaml")}
    options = ["--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path)]
    options += ["--profile", "profiles/slurm", "--configfile", str(configfile)]
    run = [str(BIN / "gpuflow"), "plan", *options, "--timings", str(records)]
    lines = subprocess.run(run, env=env, capture_output=True, text=True, check=True).stdout
    lines = lines.splitlines()
    return {
        "source": next(line.split()[5] for line in lines if line.startswith("scaling_train ")),
        "sources": next(line for line in lines if line.startswith("scaling_train: ")),
        "total": next(line for line in lines if line.startswith("Not predicted")),
    }


def test_ddp_jobs_take_the_site_s_bandwidth_and_without_it_the_plan_says_they_are_guessed(
    tmp_path,
):
    """One GPU is the measured step alone (w); on 2 and 4 the all-reduce takes the site file's
    NCCL bandwidth (s); without one it has no rate, the two jobs fall back to their limits,
    and the total line says so, naming the GPU rule."""
    site = ddp_plan(tmp_path / "site", {"within_node": 450, "between_nodes": 50})
    assert site["source"] == "w/s" and "the site file's interconnect" in site["sources"]
    assert "GPU rules" not in site["total"], "only CPU rules without a work model are guessed"
    none = ddp_plan(tmp_path / "none", None)
    assert none["source"] == "w/r" and "no allreduce.bytes rate on nvidia-h100" in none["sources"]
    assert none["total"].endswith("; GPU rules: scaling_train.")


def test_a_gpu_job_is_never_priced_at_the_cpu_s_rates(run_gpuflow, tmp_path):
    """Only this CPU's seed rates are recorded: the sweep's shards are predicted from them
    (`w`) on the CPU; asking for a GPU, they are not (a GPU's rates are no record's): they fall
    back to their limit, naming the rate a GPU node's calibration would give."""
    records = tmp_path / "records"
    records.mkdir()
    rows = [
        {"path": "seeds", "rate": {"kind": f"sweep.{m}.seed", "shape": "x", "unit": "seeds/s",
                                   "value": 100.0, "trials": [100.0]}}
        for m in ("gd", "gnc")
    ]  # fmt: skip
    record = {"device_class": this_cpu(), "created": "2026-01-01", "rows": rows}
    (records / "2026-01-01-cpu-rates.json").write_text(json.dumps(record))

    def shard(gpu: int) -> dict:
        config = tiny_config("sweep")
        config["sweep"]["resources"] = {"sweep_shard": {"gpu": gpu}}
        configfile = tmp_path / f"gpu{gpu}.yaml"
        configfile.write_text(json.dumps(config))
        done = run_gpuflow(
            "plan", "--json", "--snakefile", str(REPO / "Snakefile"), "--directory",
            str(tmp_path / f"run{gpu}"), "--configfile", str(configfile), "--timings", str(records),
        )  # fmt: skip
        return {row["rule"]: row for row in json.loads(done.stdout)}["sweep_shard"]

    assert shard(0)["source"] == "w"
    on_gpu = shard(1)
    assert on_gpu["source"] == "r" and on_gpu["gpus_per_job"] == "1"
    assert any("rate on a GPU: run `gpuflow calibrate` on a GPU node" in n for n in on_gpu["notes"])
