"""DDP training: 2 gloo processes with accumulation equal one process; a killed run resumes
(a whole run killed mid-epoch and resumed to the same weights: tests/test_hardening_workflow.py)."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from gpuflow.job.paths import STATE, job_file
from gpuflow.settings.blocks import split_json
from tests.conftest import BIN, gpuflow, wait_for_file, workflow_env

TINY_MODEL = {
    "d_model": 16, "n_heads": 2, "n_layers": 1, "ffn_dim": 32, "max_seq_len": 24, "dropout": 0.0,
}  # fmt: skip
TINY_DATA = {
    "source": "embedded", "corpus": "rotten_tomatoes", "path": None, "val_path": None,
    "n_train": 96, "n_val": 32, "val_fraction": 0.1, "seed": 0,
}  # fmt: skip
RESUME_DATA = {**TINY_DATA, "n_train": 1536, "n_val": 64}


def settings(**train: Any) -> dict[str, Any]:
    """Training settings of a tiny deterministic run (dropout off)."""
    base = {
        "epochs": 2, "global_batch_size": 16, "per_gpu_batch_size": None,
        "accumulation_steps": 1, "learning_rate": 0.003, "weight_decay": 0.01,
        "warmup_steps": 2, "eval_batch_size": 64, "num_workers": 0, "seed": 3,
    }  # fmt: skip
    return {
        "device": "cpu",
        "amp": "bf16",
        "warmup_epochs": 1,
        "cpu_threads_per_process": 1,
        "ddp": {
            "static_graph": True,
            "gradient_as_bucket_view": True,
            "bucket_cap_mb": 25,
            "compression": "none",
            "comm_probe_steps": 4,
        },
        "model": TINY_MODEL,
        "train": {**base, **train},
    }


def prepare(folder: Path, data: dict[str, Any] = TINY_DATA) -> Path:
    """Splits and encoded data made by the real steps."""
    tiny = {"data": data, "tokenizer": {"vocab_size": 300, "lowercase": True}, "model": TINY_MODEL}
    settings = json.dumps({"configurations": {"tiny": tiny}})
    gpuflow(
        "scaling-data", "--name", "tiny", "--settings", settings,
        "--out-train", str(folder / "train.csv"), "--out-val", str(folder / "val.csv"),
        "--out-info", str(folder / "data.json"),
    )  # fmt: skip
    gpuflow(
        "scaling-tokenize", "--name", "tiny", "--settings", settings,
        "--train", str(folder / "train.csv"), "--val", str(folder / "val.csv"),
        "--out-tokenizer", str(folder / "tokenizer.json"), "--out-train", str(folder / "train.npz"),
        "--out-val", str(folder / "val.npz"), "--out-stats", str(folder / "tokens.json"),
    )  # fmt: skip
    return folder


def step_settings(config: dict[str, Any]) -> list[str]:
    """A run's settings as config['scaling'] (configuration 'tiny'), split as the rule splits it."""
    shared = {k: v for k, v in config.items() if k not in ("model", "train")}
    scaling = {**shared, "configurations": {"tiny": {k: config[k] for k in ("model", "train")}}}
    return [
        "--settings", split_json("scaling", scaling, "results"),
        "--runtime", split_json("scaling", scaling, "runtime"),
    ]  # fmt: skip


def train_command(data: Path, out: Path, config: dict[str, Any], world: int) -> list[str]:
    """The command a rule runs: torchrun for several processes, plain gpuflow for one."""
    step = [
        "scaling-train", "--name", "tiny", "--train", str(data / "train.npz"),
        "--val", str(data / "val.npz"), "--data-info", str(data / "data.json"),
        "--token-stats", str(data / "tokens.json"), *step_settings(config),
        "--cpu-slots", "2", "--out-json", str(out / "run.json"),
        "--out-model", str(out / "model.pt"),
    ]  # fmt: skip
    if world == 1:
        return [str(BIN / "gpuflow"), *step]
    return [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={world}", "-m", "gpuflow",
            *step]  # fmt: skip


def train(data: Path, out: Path, config: dict[str, Any], world: int) -> dict[str, Any]:
    result = subprocess.run(
        train_command(data, out, config, world), capture_output=True, text=True,
        env=workflow_env(), timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return json.loads((out / "run.json").read_text())


def kill_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL torchrun and its workers at once, as SLURM or a node failure would."""
    launcher = psutil.Process(process.pid)
    members = [launcher, *launcher.children(recursive=True)]
    for member in members:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    psutil.wait_procs(members, timeout=30)
    process.wait()


def kill_after_a_checkpoint(data: Path, out: Path, config: dict[str, Any], world: int) -> int:
    """Start a run, SIGKILL it once its first resume state exists; the epoch that state holds."""
    state = job_file(out / "run.json", STATE)
    process = subprocess.Popen(
        train_command(data, out, config, world), env=workflow_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_for_file(state, process, 240)
    kill_tree(process)
    assert state.exists() and not (out / "run.json").exists(), "the run was not killed mid-way"
    return torch.load(state, weights_only=True)["data"]["epoch"]


def weights(path: Path) -> dict[str, torch.Tensor]:
    """Saved weights, less the attention key biases.

    A key bias shifts every attention logit of a query equally, so softmax ignores it and its
    gradient is exactly zero; what the backward pass computes there is rounding noise, which
    Adam's normalisation turns into steps of size ~lr. Those entries differ between any two
    summation orders and say nothing about DDP.
    """
    state = torch.load(path, weights_only=True)
    for name in [n for n in state if n.endswith("self_attn.in_proj_bias")]:
        query, _, value = state[name].chunk(3)
        state[name] = torch.cat([query, value])
    return state


def assert_same_weights(a: Path, b: Path) -> None:
    reference, other = weights(a), weights(b)
    assert reference.keys() == other.keys()
    for name, value in reference.items():
        torch.testing.assert_close(other[name], value, rtol=0, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def resume_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1,536 training texts: epochs long enough to kill a run inside one (read-only)."""
    return prepare(tmp_path_factory.mktemp("resume-data"), RESUME_DATA)


def test_two_gloo_processes_with_accumulation_match_one_process_on_the_same_global_batches(
    scaling_data: Path, tmp_path: Path
):
    one = train(scaling_data, tmp_path / "one", settings(accumulation_steps=1), world=1)
    two = train(scaling_data, tmp_path / "two", settings(accumulation_steps=2), world=2)

    assert (one["world_size"], one["per_gpu_batch_size"], one["accumulation_steps"]) == (1, 16, 1)
    assert (two["world_size"], two["per_gpu_batch_size"], two["accumulation_steps"]) == (2, 4, 2)
    assert one["global_batch_size"] == two["global_batch_size"] == 16
    assert two["backend"] == "gloo" and two["ddp"]["wrapped"] and not one["ddp"]["wrapped"]
    # Communication is measured apart after each epoch; the measurement leaves the training
    # as it was: the weights below still equal the single process's.
    assert all(e["comm_probe_steps"] == 4 and e["comm_total_ms"] > 0 for e in two["epochs"])
    assert all(e["sync_step_ms"] > 0 and e["no_sync_step_ms"] > 0 for e in two["epochs"])
    assert all(e["comm_probe_steps"] == 0 for e in one["epochs"])
    assert_same_weights(tmp_path / "one" / "model.pt", tmp_path / "two" / "model.pt")
    for a, b in zip(one["epochs"], two["epochs"], strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
        assert a["val_accuracy"] == pytest.approx(b["val_accuracy"], abs=1 / 32 + 1e-9)


def test_fp16_gradient_compression_trains_close_to_fp32_all_reduce(
    scaling_data: Path, tmp_path: Path
):
    exact = train(scaling_data, tmp_path / "fp32", settings(epochs=2), world=2)
    config = settings(epochs=2)
    config["ddp"]["compression"] = "fp16"
    compressed = train(scaling_data, tmp_path / "fp16", config, world=2)
    assert exact["allreduce_mb_per_step"] == pytest.approx(exact["parameters"] * 4 / 2**20)
    assert compressed["allreduce_mb_per_step"] == pytest.approx(exact["allreduce_mb_per_step"] / 2)
    for a, b in zip(exact["epochs"], compressed["epochs"], strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-2)
    fp32, fp16 = weights(tmp_path / "fp32" / "model.pt"), weights(tmp_path / "fp16" / "model.pt")
    gaps = {name: (fp16[name] - value).abs().max().item() for name, value in fp32.items()}
    assert max(gaps.values()) > 0, "fp16 compression changed nothing: was it applied?"
    assert max(gaps.values()) < 2e-2, gaps


def test_a_state_resumes_under_other_runtime_settings_but_not_on_other_data_or_results(
    resume_data: Path,
    scaling_data: Path,
    tmp_path: Path,
):
    data, other_data = resume_data, scaling_data
    config = settings(epochs=4)
    killed = tmp_path / "killed"
    state = job_file(killed / "run.json", STATE)
    finished = kill_after_a_checkpoint(data, killed, config, world=1)

    runtime = settings(epochs=4, eval_batch_size=7, num_workers=1)
    runtime["cpu_threads_per_process"] = 2
    tf32 = {**settings(epochs=4), "tf32": True}  # a results setting (fp32 matmuls on a GPU)
    for out, split, run_config, resumes in (
        (tmp_path / "runtime", data, runtime, True),
        (tmp_path / "other_data", other_data, config, False),
        (tmp_path / "tf32", data, tf32, False),
    ):
        out.mkdir()
        copy = job_file(out / "run.json", STATE)
        copy.parent.mkdir(parents=True)
        shutil.copy(state, copy)
        result = subprocess.run(
            train_command(split, out, run_config, world=1), capture_output=True, text=True,
            env=workflow_env(), timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-5000:]
        resumed = re.search(rf"resumed from \S+ after epoch {finished}\n", result.stdout)
        assert bool(resumed) is resumes, out.name
        record = json.loads((out / "run.json").read_text())
        assert record["resumed_at_epochs"] == ([finished] if resumes else []), out.name


def worker_of_rank(launcher: subprocess.Popen[bytes], rank: int) -> psutil.Process | None:
    """The torchrun worker process that holds `rank`, once it is running."""
    for child in psutil.Process(launcher.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.environ().get("RANK") == str(rank) and "gpuflow" in child.cmdline():
                return child
    return None


def test_a_crashed_rank_is_restarted_by_torchrun_and_resumes_from_the_last_epoch_in_the_same_job(
    resume_data: Path,
    tmp_path: Path,
):
    data = resume_data
    config = settings(epochs=3)
    out = tmp_path / "run"
    state = job_file(out / "run.json", STATE)
    command = train_command(data, out, config, world=2)
    command.insert(command.index("--standalone") + 1, "--max-restarts=1")
    launcher = subprocess.Popen(
        command, env=workflow_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    wait_for_file(state, launcher, 240)
    victim = worker_of_rank(launcher, 1)
    assert victim is not None and not (out / "run.json").exists(), "no rank 1 to crash mid-run"
    finished = torch.load(state, weights_only=True)["data"]["epoch"]
    victim.kill()  # one rank dies; the other rank and the torchrun agent live on

    output = launcher.communicate(timeout=300)[0].decode()
    assert launcher.returncode == 0, output[-5000:]
    assert re.search(rf"resumed from \S+ after epoch {finished}\n", output)
    run = json.loads((out / "run.json").read_text())
    assert [e["epoch"] for e in run["epochs"]] == [1, 2, 3]
    assert run["resumed_at_epochs"] == [finished] and not state.exists()


TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
ONE_PROCESS_GROUP = f"""
TORCHRUN_VARIABLES = {TORCHRUN_VARIABLES}
import os, psutil, torch, torch.distributed as dist
from gpuflow.scaling import distributed
ctx = distributed.init("cpu")
dist.all_reduce(torch.ones(2))
print(sorted(c.status for c in psutil.Process().net_connections(kind="tcp")))
print((ctx.rank, ctx.world_size), [name for name in TORCHRUN_VARIABLES if name in os.environ])
"""


def test_a_one_process_run_started_by_hand_connects_to_no_store_on_a_port_nor_sets_torchrun_vars():
    """Its group's store lives in the process: no port is picked for it and bound later, which
    a job starting beside it could take first. Gloo listens on the port the OS gives it. Rank 0
    of 1 is the group's, not the environment's: later code in the process (a test's next run)
    must not take itself for a torchrun rank."""
    env = {key: value for key, value in workflow_env().items() if key not in TORCHRUN_VARIABLES}
    result = subprocess.run(
        [str(BIN / "python"), "-c", ONE_PROCESS_GROUP], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-2:] == ["['LISTEN']", "(0, 1) []"]


def test_two_torchrun_agents_meeting_by_c10d_rendezvous_train_as_one_two_node_world(
    scaling_data: Path, tmp_path: Path
):
    """The multi-node launch (one agent per node, c10d on the first host), on this machine."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    step = train_command(scaling_data, tmp_path, settings(), world=1)[1:]
    logs = [open(tmp_path / f"agent{i}.log", "w") for i in range(2)]  # noqa: SIM115
    agents = [
        subprocess.Popen(
            [
                str(BIN / "torchrun"),
                "--nnodes=2",
                "--nproc-per-node=1",
                "--rdzv-id=test",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "-m",
                "gpuflow",
                *step,
            ],
            env=workflow_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for log in logs
    ]
    codes = [agent.wait(timeout=300) for agent in agents]
    for log in logs:
        log.close()
    assert codes == [0, 0], (tmp_path / "agent0.log").read_text()[-3000:]
    run = json.loads((tmp_path / "run.json").read_text())
    assert (run["world_size"], run["nodes"], run["processes_per_node"]) == (2, 2, 1)
    assert run["per_gpu_batch_size"] == 8 and len(run["ranks"]) == 2
