"""`gpuflow scaling-report`: performance_report.txt, a diagnosis derived from the measurements."""

from __future__ import annotations

import argparse

import pandas as pd

from gpuflow.job import telemetry_section, write_text
from gpuflow.settings.blocks import family_settings

DDP = "transformer-ddp"
COMM_MINOR = 0.10  # below this share of epoch time, communication is not worth optimising
COMM_TARGET = 0.10  # accumulation is sized to bring the share down to this
COMPUTE_INFLATION = 1.3  # per-step compute this much above ideal means starved devices
NOISY = 0.15  # relative spread of epoch times above which the timings are flagged
EMBEDDING_HEAVY = 0.5  # token embedding share of the gradient above which it is named
CONTENDED = 0.75  # CPU runs whose processes got less of their cores than this shared the machine


def pct(value: float) -> str:
    """A fraction as a percentage with one decimal."""
    return f"{100 * value:.1f}%"


def workers(run: pd.Series, nodes: bool = True) -> str:
    """'1 GPU', '4 GPUs on 2 nodes' (with `nodes`), or '2 processes' for CPU runs."""
    n = int(run["world_size"])
    noun = "GPU" if run["device_type"] == "cuda" else "process"
    plural = "" if n == 1 else ("s" if noun == "GPU" else "es")
    on = f" on {int(run['nodes'])} nodes" if nodes and run["nodes"] > 1 else ""
    return f"{n} {noun}{plural}{on}"


def verdict(speedup: float, efficiency: float, target: float) -> str:
    """One word on a run's scaling, from its speedup and efficiency."""
    if speedup < 1:
        return "NEGATIVE SCALING (slower than the reference)"
    if efficiency >= target:
        return "good scaling"
    return "below the efficiency target"


def accumulation_advice(run: pd.Series) -> tuple[int, float]:
    """(accumulation factor, predicted speedup) that brings the comm share near COMM_TARGET."""
    compute = run["epoch_seconds"] - run["comm_exposed_seconds_per_epoch"]
    comm = run["comm_exposed_seconds_per_epoch"]
    k = 2
    while k < 16 and comm / k / (compute + comm / k) > COMM_TARGET:
        k *= 2
    return k, run["epoch_seconds"] / (compute + comm / k) * run["speedup"]


def hidden_text(exposed: float, total: float) -> str:
    """How much of the total all-reduce overlap hides, in words."""
    if total <= 0:
        return "nothing to hide"
    if exposed > total:
        return (
            "exposed exceeds the bare all-reduce: run beside the backward pass it also slows "
            "the compute (shared cores or memory bandwidth), so overlap hides nothing here"
        )
    return f"overlap hides {pct(1 - exposed / total)}"


def compressed_exposed_seconds(run: pd.Series) -> float:
    """Exposed all-reduce per epoch predicted with 16-bit gradients."""
    total, exposed = run["comm_total_seconds_per_epoch"], run["comm_exposed_seconds_per_epoch"]
    return max(0.0, total / 2 - (total - exposed))


def run_lines(run: pd.Series, reference: pd.Series, target: float) -> list[str]:
    """Diagnosis of one run against its configuration's reference run."""
    world, ref_world = int(run["world_size"]), int(reference["world_size"])
    lines = [
        f"  {workers(run)}: epoch {run['epoch_seconds']:.2f} s vs "
        f"{reference['epoch_seconds']:.2f} s at {ref_world}; speedup {run['speedup']:.2f}x of "
        f"ideal {world / ref_world:.0f}x, efficiency {pct(run['efficiency'])}: "
        f"{verdict(run['speedup'], run['efficiency'], target)}."
    ]
    comm, compute = run["comm_exposed_ms_per_step"], run["compute_ms_per_step"]
    total, share = run["comm_total_ms_per_step"], run["comm_exposed_share"]
    lines.append(
        f"    per optimizer step: compute {compute:.1f} ms, exposed all-reduce {comm:.1f} ms "
        f"({pct(share)} of the epoch) of {total:.1f} ms total all-reduce "
        f"({hidden_text(comm, total)}), {run['allreduce_mb_per_step']:.2f} MB reduced."
    )
    if comm >= compute:
        lines.append("    -> communication dominates: each step waits longer for the all-reduce "
                     "than it computes.")  # fmt: skip
    elif share >= COMM_MINOR:
        lines.append(f"    -> communication is a significant cost ({pct(share)} of the epoch).")
    else:
        lines.append(f"    -> communication is minor ({pct(share)} of the epoch).")
    ideal_epoch = reference["epoch_seconds"] * ref_world / world
    excess = run["epoch_seconds"] - ideal_epoch
    if excess > 0:
        from_comm = min(1.0, run["comm_exposed_seconds_per_epoch"] / excess)
        rest = (
            "all of it"
            if from_comm >= 0.995
            else f"{pct(from_comm)}; the rest is slower compute and waiting at synchronisation"
        )
        lines.append(
            f"    of the {excess:.2f} s per epoch lost against ideal, exposed all-reduce accounts "
            f"for {rest}."
        )
    no_comm = reference["epoch_seconds"] / (
        run["epoch_seconds"] - run["comm_exposed_seconds_per_epoch"]
    )
    lines.append(f"    without the exposed all-reduce the speedup would be {no_comm:.2f}x.")
    ideal_compute = reference["compute_ms_per_step"] * ref_world / world
    inflation = compute / ideal_compute if ideal_compute > 0 else float("nan")
    if inflation >= COMPUTE_INFLATION:
        lines.append(
            f"    -> compute per step is {inflation:.1f}x the ideal {ideal_compute:.1f} ms: with "
            f"{int(run['per_gpu_batch_size'])} samples per GPU and micro-step the devices are "
            "under-used (fixed per-step costs do not shrink)."
        )
    embedding = run["token_embedding_parameters"] / run["parameters"]
    if embedding >= EMBEDDING_HEAVY and share >= COMM_MINOR:
        lines.append(
            f"    -> {pct(embedding)} of the gradient is the token embedding "
            f"({int(run['token_embedding_parameters']):,} of {int(run['parameters']):,} "
            "parameters)."
        )
    return lines


def recommendations(run: pd.Series, target: float) -> list[str]:
    """What to change for this configuration, from its largest run's numbers."""
    tips = []
    share = run["comm_exposed_share"]
    if share >= COMM_MINOR:
        k, predicted = accumulation_advice(run)
        tips.append(
            f"accumulate {k * int(run['accumulation_steps'])} micro-steps per all-reduce "
            f"(train.accumulation_steps; the global batch grows {k}x unless per-GPU batch "
            f"shrinks): predicted speedup {predicted:.2f}x (compute + comm/{k})."
        )
        saved = run["comm_exposed_seconds_per_epoch"] - compressed_exposed_seconds(run)
        predicted = run["speedup"] * run["epoch_seconds"] / (run["epoch_seconds"] - saved)
        tips.append(
            "compress gradients to 16 bits (scaling.ddp.compression: fp16 or bf16) to halve the "
            f"{run['allreduce_mb_per_step']:.2f} MB per step: predicted speedup {predicted:.2f}x "
            "(half the total all-reduce, less the part overlap already hides)."
        )
        tips.append(
            f"give each all-reduce more work: a larger per-GPU batch (now "
            f"{int(run['per_gpu_batch_size'])}) or a wider/deeper model raises compute per step "
            f"(now {run['compute_ms_per_step']:.1f} ms) against a gradient of the same size."
        )
        embedding = run["token_embedding_parameters"] / run["parameters"]
        if embedding >= EMBEDDING_HEAVY:
            tips.append(
                f"the token embedding is {pct(embedding)} of the gradient: a smaller vocabulary "
                "shrinks every all-reduce."
            )
    if run["efficiency"] >= target and share < COMM_MINOR:
        tips.append(
            f"no change needed at {workers(run, nodes=False)}: efficiency "
            f"{pct(run['efficiency'])} meets the {pct(target)} target."
        )
    elif not tips:
        tips.append(
            f"efficiency {pct(run['efficiency'])} is below target while communication is only "
            f"{pct(share)}: profile the compute (data loading, per-step overheads) before "
            "adding GPUs."
        )
    return tips


def cost_lines(cost: pd.DataFrame, target: float) -> list[str]:
    """GPU-hours per run and the world size worth paying for."""
    lines = []
    for _, row in cost.iterrows():
        extra = (
            f", +{row['cost_increase_pct']:.0f}% GPU-hours, "
            f"{row['speedup_per_extra_gpu_hour']:.3g} speedup per extra GPU-hour"
            if row["extra_gpu_hours"] > 0
            else ""
        )
        lines.append(
            f"  {workers(row)}: {row['gpu_hours']:.3g} GPU-hours "
            f"({row['run_wall_hours'] * 3600:.1f} s wall), speedup {row['speedup']:.2f}x{extra}"
        )
    efficient = cost[cost["efficiency"] >= target]
    best = efficient.sort_values("world_size").iloc[-1] if not efficient.empty else None
    if best is not None and best["world_size"] > cost["world_size"].min():
        lines.append(
            f"  -> recommended: {workers(best)}, the largest world size still at {pct(target)} "
            f"efficiency or more ({pct(best['efficiency'])})."
        )
    else:
        lines.append(
            "  -> recommended: stay on the reference world size; no larger run reached "
            f"{pct(target)} efficiency, so extra GPUs mostly buy waiting."
        )
    return lines


def compare(largest: dict[str, pd.Series]) -> list[str]:
    """Which configuration scales worse and whether its communication share explains it."""
    if len(largest) < 2:
        return []
    ranked = sorted(largest.items(), key=lambda item: item[1]["efficiency"])
    (worst_name, worst), (best_name, best) = ranked[0], ranked[-1]
    lines = [
        f"{worst_name} scales worse than {best_name}: efficiency {pct(worst['efficiency'])} at "
        f"{workers(worst)} vs {pct(best['efficiency'])} at {workers(best)}.",
        f"Share of the epoch in exposed gradient all-reduce: {worst_name} "
        f"{pct(worst['comm_exposed_share'])}, {best_name} {pct(best['comm_exposed_share'])}.",
    ]
    if worst["comm_exposed_share"] > best["comm_exposed_share"]:
        weight = {
            name: run["comm_exposed_ms_per_step"] / max(run["compute_ms_per_step"], 1e-9)
            for name, run in ((worst_name, worst), (best_name, best))
        }
        ratio = weight[worst_name] / max(weight[best_name], 1e-9)
        lines.append(
            f"Why: per optimizer step {worst_name} computes {worst['compute_ms_per_step']:.1f} ms "
            f"and waits {worst['comm_exposed_ms_per_step']:.1f} ms for the all-reduce of "
            f"{worst['allreduce_mb_per_step']:.2f} MB ({weight[worst_name]:.2f} ms of "
            f"communication per ms of compute); {best_name} computes "
            f"{best['compute_ms_per_step']:.1f} ms for {best['allreduce_mb_per_step']:.2f} MB "
            f"({weight[best_name]:.2f}). With {ratio:.1f}x "
            f"more communication per unit of compute, {worst_name}'s gradient exchange is not "
            "amortised by its work per step."
        )
    else:
        lines.append(
            f"Communication does not explain it ({worst_name}'s share is not higher): compare "
            "compute per step and epoch-time spread."
        )
    return lines


def build_report(summary: pd.DataFrame, cost: pd.DataFrame, target: float) -> str:
    """The whole report text."""
    runs = summary[summary["method"] == DDP]
    baselines = summary[summary["method"] != DDP]
    out = ["DDP SCALING PERFORMANCE REPORT", "=" * 30, ""]
    devices = ", ".join(sorted(set(runs["device_type"])))
    out.append(
        f"Devices: {devices} (backend {', '.join(sorted(set(runs['backend'])))}); speedup is "
        "against the smallest single-node world size; means exclude warm-up epochs; epochs are "
        "timed with DDP's communication/backward overlap on. Communication is measured apart, on "
        "each epoch's first micro-batches: total = the bare all-reduce of a step's gradients; "
        "exposed = step time with gradient sync minus step time under no_sync (what overlap does "
        "not hide). Diagnosis and predictions use the exposed part."
    )
    if "cpu" in set(runs["device_type"]):
        out.append(
            "On CPU each process stands for one GPU (gloo backend); the figures show how the "
            "same code behaves, not GPU speeds."
        )
    largest: dict[str, pd.Series] = {}
    for name, group in runs.groupby("configuration", sort=False):
        group = group.sort_values(["nodes", "world_size"])
        reference = group[group["world_size"] == group["reference_world_size"]].iloc[0]
        out += ["", f"[{name}]"]
        first = group.iloc[0]
        out.append(
            f"  model {int(first['parameters']):,} parameters; global batch "
            f"{int(first['global_batch_size'])}, accumulation {int(first['accumulation_steps'])}; "
            f"precision {first['precision']}; {int(first['steps_per_epoch'])} steps per epoch."
        )
        for _, run in group[group["skipped_steps"] > 0].iterrows():
            out.append(
                f"  note: at {workers(run)} the fp16 loss scaler skipped "
                f"{int(run['skipped_steps'])} optimizer step(s) for overflow; "
                "they changed no weight and are left out of the training loss."
            )
        spread = (group["epoch_seconds_std"] / group["epoch_seconds"]).max()
        if spread > NOISY:
            out.append(
                f"  note: epoch times vary by up to {pct(spread)} within a run (busy machine?): "
                "treat small differences as noise and re-measure."
            )
        if "cpu" in set(group["device_type"]):
            starved = group[group["cpu_utilisation"] < CONTENDED]
            for _, run in starved.iterrows():
                out.append(
                    f"  note: at {workers(run, nodes=False)} each process "
                    f"ran on its cores only {pct(run['cpu_utilisation'])} of its compute time "
                    "(CPU time / wall time outside the all-reduce): other work shared the "
                    "machine, so this run's times are inflated."
                )
        others = group[group.index != reference.name]
        if others.empty:
            out.append("  only one world size: no scaling to judge.")
        for _, run in others.iterrows():
            out += run_lines(run, reference, target)
        for _, base in baselines[baselines["configuration"] == name].iterrows():
            gap = group["final_val_accuracy"].max() - base["final_val_accuracy"]
            out.append(
                f"  CPU baseline {base['method']}: validation accuracy "
                f"{pct(base['final_val_accuracy'])} ({int(base['cpu_threads'])} CPU thread(s), "
                f"{base['run_wall_seconds']:.1f} s); the transformer is "
                f"{abs(100 * gap):.1f} points {'better' if gap >= 0 else 'worse'}."
            )
        if not others.empty:
            top = others[others["nodes"] == 1]
            top = (top if not top.empty else others).sort_values("world_size").iloc[-1]
            largest[name] = top
            out.append("  Recommendations:")
            out += [f"   - {tip}" for tip in recommendations(top, target)]
        out.append("  Cost:")
        out += cost_lines(cost[cost["configuration"] == name], target)
    comparison = compare(largest)
    if comparison:
        out += ["", "COMPARISON", *comparison]
    return "\n".join(out) + "\n"


def main(args: argparse.Namespace) -> None:
    """Write performance_report.txt from the summary and cost tables."""
    summary = pd.read_csv(args.summary)
    cost = pd.read_csv(args.cost)
    target = family_settings("scaling", args.settings)["efficiency_target"]
    text = build_report(summary, cost, target) + telemetry_section(args.out)
    write_text(args.out, text)
    print(text)
