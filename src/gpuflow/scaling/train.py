"""`gpuflow scaling-train`: train the classifier with DDP and measure every epoch."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import resource
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from gpuflow.errors import ConfigError
from gpuflow.job import (
    SkippedSteps,
    current,
    describe_device,
    load_optimizer_state,
    run_record,
    save_torch,
    write_json,
)
from gpuflow.scaling import comm, distributed
from gpuflow.scaling.distributed import Context
from gpuflow.scaling.kernels import adamw, padded_length_multiple, set_tf32, use_fused_adamw
from gpuflow.scaling.layout import batch_plan, process_threads
from gpuflow.scaling.model import build_model, parameter_counts
from gpuflow.scaling.results import train_results
from gpuflow.settings.blocks import configuration, family_settings, results_of


class EncodedTexts(Dataset):
    """Token ids and labels of one split written by `scaling-tokenize`."""

    def __init__(self, path: str | Path):
        with np.load(path) as data:
            self.ids, self.offsets = data["ids"], data["offsets"]
            self.labels = data["labels"]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        return self.ids[self.offsets[index] : self.offsets[index + 1]], int(self.labels[index])


def collate(items: list[tuple[np.ndarray, int]], multiple: int, max_length: int) -> dict[str, Any]:
    """Pad a batch to its own longest text rounded up to `multiple` (at most `max_length`,
    gpuflow.scaling.kernels.padded_length_multiple); count its real tokens on the CPU."""
    longest = max(len(ids) for ids, _ in items)
    length = max(longest, min(-(-longest // multiple) * multiple, max_length))
    ids = torch.zeros(len(items), length, dtype=torch.long)
    for row, (tokens, _) in enumerate(items):
        ids[row, : len(tokens)] = torch.from_numpy(tokens.astype(np.int64))
    labels = torch.tensor([label for _, label in items], dtype=torch.long)
    return {"ids": ids, "mask": ids != 0, "labels": labels, "tokens": sum(len(t) for t, _ in items)}


def lr_schedule(warmup_steps: int, total_steps: int) -> Any:
    """Linear warm-up, then cosine decay to zero, as a LambdaLR factor of the optimizer step."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def precision_for(device: torch.device, amp: str) -> str:
    """fp32 on CPU; on GPU the configured AMP dtype (bf16 needs a GPU that supports it)."""
    if device.type != "cuda" or amp == "none":
        return "fp32"
    if amp == "bf16" and not torch.cuda.is_bf16_supported():
        raise ConfigError("scaling.amp", "this GPU has no bf16 support", "fp16 or none")
    return amp


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory since the last reset: allocated GPU memory, or this process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def move(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Tensors of a batch on `device` (asynchronous copies from pinned memory)."""
    return {
        k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()
    }


def evaluate(
    model: torch.nn.Module, loader: DataLoader, ctx: Context, autocast: Any
) -> tuple[float, float]:
    """(validation loss, accuracy) over the shards of all processes."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=ctx.device)
    with torch.no_grad():
        for batch in loader:
            batch = move(batch, ctx.device)
            with autocast():
                logits = model(batch["ids"], batch["mask"]).float()
            loss = torch.nn.functional.cross_entropy(logits, batch["labels"], reduction="sum")
            totals[0] += loss.double()
            totals[1] += (logits.argmax(-1) == batch["labels"]).sum().double()
            totals[2] += len(batch["labels"])
    loss_sum, correct, count = distributed.all_reduce(totals.tolist(), ctx)
    model.train()
    return loss_sum / count, correct / count


@dataclass(frozen=True)
class RunFiles:
    """What one run is (its configuration's name), reads and writes, and the CPU processes its
    cores are shared by: the step's arguments of the same names."""

    name: str
    train: str
    val: str
    data_info: str
    token_stats: str
    out_json: str
    out_model: str
    cpu_slots: int = 1

    @classmethod
    def of(cls, args: argparse.Namespace) -> RunFiles:
        """The step's arguments of these names."""
        return cls(**{field.name: getattr(args, field.name) for field in fields(cls)})


class Trainer:
    """One run: model, data, optimizer, the epoch loop and its measurements."""

    def __init__(
        self,
        ctx: Context,
        files: RunFiles,
        settings: dict[str, Any],
        results: dict[str, Any],
        nccl: dict[str, str] | None = None,
    ):
        """`settings`: see `run_settings`; `results`: its results-affecting part (resume key);
        `nccl`: the NCCL_* variables in force in this process (recorded, per rank too)."""
        self.ctx, self.files, self.settings = ctx, files, settings
        self.nccl = dict(nccl or {})
        train = settings["train"]
        self.plan = batch_plan(train, ctx.world_size, f"scaling.configurations.{files.name}.train")
        self.threads = process_threads(
            ctx.device.type == "cuda",
            ctx.local_world_size,
            settings["cpu_threads_per_process"],
            files.cpu_slots,
        )
        torch.set_num_threads(self.threads)
        torch.backends.cudnn.benchmark = ctx.device.type == "cuda"
        self.precision = precision_for(ctx.device, settings["amp"])

        full = EncodedTexts(files.train)
        self.steps_per_epoch = len(full) // self.plan.global_batch_size
        if self.steps_per_epoch == 0:
            raise ConfigError(
                f"scaling.configurations.{files.name}.train.global_batch_size",
                f"{self.plan.global_batch_size} is more than the {len(full)} training texts",
            )
        self.n_used = self.steps_per_epoch * self.plan.global_batch_size
        used = Subset(full, range(self.n_used))
        self.sampler = DistributedSampler(
            used, ctx.world_size, ctx.rank, shuffle=True, seed=train["seed"], drop_last=True
        )
        pin = ctx.device.type == "cuda"
        self.length_multiple = padded_length_multiple(ctx.device, self.precision)
        pad = functools.partial(
            collate, multiple=self.length_multiple, max_length=settings["model"]["max_seq_len"]
        )
        # Pinned memory on GPU; training workers kept alive between epochs.
        workers = train["num_workers"]
        self.loader = DataLoader(
            used,
            self.plan.per_gpu_batch_size,
            sampler=self.sampler,
            num_workers=workers,
            collate_fn=pad,
            pin_memory=pin,
            persistent_workers=workers > 0,
            prefetch_factor=4 if workers > 0 else None,
        )
        val = EncodedTexts(files.val)
        self.n_val = len(val)
        shard = Subset(val, range(ctx.rank, len(val), ctx.world_size))
        self.val_loader = DataLoader(
            shard, train["eval_batch_size"], collate_fn=pad, pin_memory=pin
        )

        info = json.loads(Path(files.data_info).read_text())
        vocab = json.loads(Path(files.token_stats).read_text())["vocab_size"]
        torch.manual_seed(train["seed"])
        self.model = build_model(settings["model"], vocab, info["n_classes"]).to(ctx.device)
        self.counts = parameter_counts(self.model)
        self.ddp: DistributedDataParallel | None = None
        ddp = settings["ddp"]
        if ctx.world_size > 1:
            self.ddp = DistributedDataParallel(
                self.model,
                device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
                static_graph=ddp["static_graph"],
                gradient_as_bucket_view=ddp["gradient_as_bucket_view"],
                bucket_cap_mb=ddp["bucket_cap_mb"],
            )
            if ddp["compression"] != "none":  # else DDP's own all-reduce, overlap intact
                hook = distributed.COMPRESSION_HOOKS[ddp["compression"]]
                self.ddp.register_comm_hook(dist.group.WORLD, hook)
        self.optimizer = adamw(
            self.model.parameters(),
            use_fused_adamw(settings["fused_adamw"], ctx.device),
            lr=train["learning_rate"],
            weight_decay=train["weight_decay"],
        )
        self.tf32 = set_tf32(settings["tf32"], ctx.device)
        total_steps = train["epochs"] * self.steps_per_epoch
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_schedule(train["warmup_steps"], total_steps)
        )
        self.scaler = torch.amp.GradScaler(ctx.device.type, enabled=self.precision == "fp16")
        self.skipped = SkippedSteps(settings["amp_overflow_limit"])
        self.job = current([files.out_json, files.out_model])
        self.state = self.job.state(
            inputs=[files.train, files.val, files.data_info],
            settings=results,
            identity={
                "world_size": ctx.world_size,
                "n_used": self.n_used,
                "precision": self.precision,  # fp32 on CPU whatever amp says: no GradScaler state
                "device_type": ctx.device.type,  # dropout draws, TF32 (GPU only) and the timings
            },
        )
        self.history: list[dict[str, Any]] = []
        self.resumed_at: list[int] = []
        run = {"configuration": files.name, "world_size": ctx.world_size, "nodes": ctx.nodes}
        self.tracked = self.job.track({**results, **run, "precision": self.precision})

    @property
    def run_name(self) -> str:
        """How the NaN guard names this run."""
        return f"{self.files.name} world={self.ctx.world_size}"

    def autocast(self) -> Any:
        """The forward-pass precision context."""
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(self.ctx.device.type, dtype=dtype, enabled=self.precision != "fp32")

    def load_state(self, state: dict[str, Any]) -> int:
        """Continue from a saved `saved_state()`; returns the epochs it holds."""
        self.model.load_state_dict(state["model"])
        load_optimizer_state(self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.history = state["history"]
        self.skipped.total = sum(e.get("skipped_steps", 0) for e in self.history)
        self.skipped.at_floor = state.get("skipped_at_floor", 0)
        self.resumed_at = [*state["resumed_at"], state["epoch"]]
        return state["epoch"]

    def saved_state(self) -> dict[str, Any]:
        """What a resumed run needs to continue exactly where this one is (rank 0's)."""
        return {
            "epoch": len(self.history),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "history": self.history,
            "resumed_at": self.resumed_at,
            "skipped_at_floor": self.skipped.at_floor,
        }

    def forward_backward(self, batch: dict[str, Any], divisor: int = 1) -> torch.Tensor:
        """Loss of one micro-batch and its backward pass (through DDP when wrapped)."""
        with self.autocast():
            logits = (self.ddp or self.model)(batch["ids"], batch["mask"])
        loss = torch.nn.functional.cross_entropy(logits.float(), batch["labels"])
        self.scaler.scale(loss / divisor).backward()
        return loss

    def optimizer_step(self) -> bool:
        """One optimizer step through the loss scaler; False when the scaler skipped it."""
        scale = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        skipped = self.scaler.get_scale() < scale
        self.skipped.observe(skipped, scale)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return not skipped

    def measure_comm(self, batches: list[dict[str, Any]]) -> dict[str, Any]:
        """Total and exposed all-reduce per step on `batches`, measured apart from the epoch."""
        probe = comm.NO_PROBE
        if self.ddp is not None and batches:
            probe = comm.measure(
                self.ddp, batches, self.forward_backward, self.ctx, self.settings["ddp"]
            )
        return {
            "comm_total_ms": probe.total_ms,
            "comm_exposed_ms": probe.exposed_ms,
            "sync_step_ms": probe.sync_step_ms,
            "no_sync_step_ms": probe.no_sync_step_ms,
            "comm_probe_steps": probe.probe_steps,
        }

    def train_epoch(self, epoch: int, first_step: bool) -> dict[str, Any]:
        """One pass over the training set, timed between two barriers; then the comm probe."""
        ctx, plan = self.ctx, self.plan
        self.sampler.set_epoch(epoch)
        torch.manual_seed(self.settings["train"]["seed"] * 100_003 + epoch * 101 + ctx.rank)
        keep = self.settings["ddp"]["comm_probe_steps"] if self.ddp else 0
        probe_batches: list[dict[str, Any]] = []
        if ctx.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(ctx.device)
        loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
        tokens, applied, skipped_before = 0, 0, self.skipped.total
        step_losses: list[torch.Tensor] = []
        static = self.settings["ddp"]["static_graph"]
        distributed.barrier(ctx)
        start, cpu_start = time.perf_counter(), time.process_time()
        data_wait, mark = 0.0, start
        for index, batch in enumerate(self.loader):
            data_wait += time.perf_counter() - mark
            batch = move(batch, ctx.device)
            last_micro = (index + 1) % plan.accumulation_steps == 0
            # static_graph asserts on a first iteration under no_sync: synchronise that one.
            sync = last_micro or (first_step and static)
            skip_sync = self.ddp.no_sync() if self.ddp and not sync else contextlib.nullcontext()
            with skip_sync:
                loss = self.forward_backward(batch, plan.accumulation_steps)
            first_step = False
            if len(probe_batches) < keep:
                probe_batches.append(batch)
            step_losses.append(loss.detach())
            tokens += batch["tokens"]
            if last_micro:
                # A skipped step's losses (inf or NaN after an overflow) stay out of the mean.
                if self.optimizer_step():
                    for micro_loss in step_losses:
                        loss_sum += micro_loss.double()
                    applied += 1
                step_losses = []
                self.job.check_skipped(self.run_name, epoch + 1, self.skipped)
            mark = time.perf_counter()
        distributed.barrier(ctx)
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        sums = distributed.all_reduce([loss_sum.item(), tokens, cpu, applied], ctx)
        applied_micro_steps = sums[3] * plan.accumulation_steps
        (memory,) = distributed.all_reduce([peak_memory_mb(ctx.device)], ctx, "max")
        return {
            "epoch": epoch + 1,
            "measured": epoch >= self.settings["warmup_epochs"],
            "train_seconds": seconds,
            "data_wait_seconds": data_wait,
            "cpu_seconds_per_process": sums[2] / ctx.world_size,
            "optimizer_steps": self.steps_per_epoch,
            "samples": self.n_used,
            "tokens": int(sums[1]),
            "samples_per_second": self.n_used / seconds,
            "tokens_per_second": sums[1] / seconds,
            "train_loss": sums[0] / applied_micro_steps if applied_micro_steps else None,
            "skipped_steps": self.skipped.total - skipped_before,
            "loss_scale": self.scaler.get_scale(),
            "peak_memory_mb": memory,
            **self.measure_comm(probe_batches),
        }

    def fit(self) -> list[dict[str, Any]]:
        """Run the remaining epochs, saving the resume state after each; return all epochs."""
        epochs = self.settings["train"]["epochs"]
        first_step = True
        for epoch in self.job.loop(
            self.state, epochs, "epochs", load=self.load_state, save=self.saved_state,
            map_location=self.ctx.device, ranks=distributed.Ranks(self.ctx),
        ):  # fmt: skip
            record = self.train_epoch(epoch - 1, first_step)
            begin = time.perf_counter()
            val_loss, accuracy = evaluate(self.model, self.val_loader, self.ctx, self.autocast)
            record.update(
                val_seconds=time.perf_counter() - begin,
                val_loss=val_loss,
                val_accuracy=accuracy,
                after_resume=bool(self.resumed_at) and first_step,
            )
            first_step = False
            losses = {"train_loss": record["train_loss"], "val_loss": val_loss}
            self.job.check_finite(
                self.run_name, epoch, {k: v for k, v in losses.items() if v is not None}
            )
            self.history.append(record)
            self.tracked.log(epoch, {k: v for k, v in record.items() if k != "epoch"})
            if self.ctx.rank == 0:
                rounded = {k: round(v, 4) if isinstance(v, float) else v for k, v in record.items()}
                print(json.dumps(rounded), flush=True)
        measured = [e for e in self.history if e["measured"]] or self.history
        final = {key: self.history[-1][key] for key in ("val_loss", "val_accuracy")}
        rate = sum(e["tokens_per_second"] for e in measured) / len(measured)
        self.tracked.final(len(self.history), {**final, "tokens_per_second": rate})
        return self.history

    def note_timings(self) -> None:
        """The job's own timings for its telemetry flags (gpuflow.job.telemetry.flags): seconds rank
        0 waited for batches, the exposed communication share of a step, the step time."""
        epochs = [e for e in self.history if e["measured"]] or self.history
        steps = sum(e["optimizer_steps"] for e in epochs)
        if not steps:
            return
        step_ms = 1000 * sum(e["train_seconds"] for e in epochs) / steps
        exposed_ms = sum(e["comm_exposed_ms"] for e in epochs) / len(epochs)
        self.job.note(
            data_wait_s=sum(e.get("data_wait_seconds", 0.0) for e in self.history),
            comm_exposed_share=min(1.0, exposed_ms / step_ms) if step_ms else 0.0,
            step_s=step_ms / 1000,
            batch_size=self.plan.per_gpu_batch_size,
        )

    def result(self) -> dict[str, Any]:
        """The run's JSON record: set-up, batch sizes, model size and every epoch."""
        ctx, plan, ddp = self.ctx, self.plan, self.settings["ddp"]
        bytes_per_element = 2 if ddp["compression"] != "none" else 4
        self.note_timings()
        ranks: list[Any] = [None] * ctx.world_size
        mine = {
            "rank": ctx.rank,
            "skipped_steps": self.skipped.total,
            "nccl": self.nccl,
            **run_record([ctx.device]),
        }
        dist.all_gather_object(ranks, mine)
        return {
            "configuration": self.files.name,
            "world_size": ctx.world_size,
            "nodes": ctx.nodes,
            "processes_per_node": ctx.local_world_size,
            "device_type": ctx.device.type,
            "device": describe_device(ctx.device),
            "backend": ctx.backend,
            "precision": self.precision,
            "fused_adamw": bool(self.optimizer.param_groups[0]["fused"]),
            "tf32": self.tf32,
            "padded_length_multiple": self.length_multiple,
            "skipped_steps": self.skipped.total,
            "torch_threads_per_process": self.threads,
            "global_batch_size": plan.global_batch_size,
            "per_gpu_batch_size": plan.per_gpu_batch_size,
            "accumulation_steps": plan.accumulation_steps,
            "steps_per_epoch": self.steps_per_epoch,
            "n_train_used": self.n_used,
            "n_val": self.n_val,
            "parameters": self.counts["total"],
            "token_embedding_parameters": self.counts["token_embedding"],
            "allreduce_mb_per_step": self.counts["total"] * bytes_per_element / 2**20
            if ctx.world_size > 1
            else 0.0,
            "ddp": {**ddp, "wrapped": self.ddp is not None},
            "model": self.settings["model"],
            "train": self.settings["train"],
            "warmup_epochs": self.settings["warmup_epochs"],
            "resumed_at_epochs": self.resumed_at,
            "torch_version": torch.__version__,
            "rendezvous": distributed.rendezvous(),
            "nccl": self.nccl,
            "run_record": run_record([ctx.device]),
            "ranks": ranks,
            "epochs": self.history,
        }


def run_settings(scaling: dict[str, Any], name: str) -> dict[str, Any]:
    """What one run of configuration `name` reads from a defaulted config['scaling']."""
    chosen = configuration(scaling, name)
    shared = (
        "device", "amp", "amp_overflow_limit", "fused_adamw", "tf32", "warmup_epochs",
        "cpu_threads_per_process", "ddp",
    )  # fmt: skip
    return {**{k: scaling[k] for k in shared}, "model": chosen["model"], "train": chosen["train"]}


def results_part(scaling: dict[str, Any], name: str) -> dict[str, Any]:
    """The results-affecting settings of configuration `name` (its data settings included)."""
    return results_of("scaling", train_results(scaling, name))


def main(args: argparse.Namespace) -> None:
    """Train one run; rank 0 writes the run JSON and the weights, then releases the resume state."""
    scaling = family_settings("scaling", args.settings, args.runtime)
    settings = run_settings(scaling, args.name)
    nccl = distributed.use_nccl(args.nccl)  # before NCCL starts
    ctx = distributed.init(settings["device"])
    try:
        results = results_part(scaling, args.name)
        trainer = Trainer(ctx, RunFiles.of(args), settings, results, nccl)
        trainer.fit()
        result = trainer.result()
        if ctx.rank == 0:
            save_torch(args.out_model, trainer.model.state_dict())
            write_json(args.out_json, result)
            trainer.job.release(outputs=[args.out_model, args.out_json])
        distributed.barrier(ctx)
    finally:
        dist.destroy_process_group()
