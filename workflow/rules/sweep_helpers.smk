"""Helpers of the seed-sweep family: shard paths and settings (its checks across keys:
gpuflow.sweep.checks, run with the schema's)."""

SWEEP = config["sweep"]
SWEEP_DIR = "results/sweep"
SWEEP_CELL = "method~{method}/rank~{rank}/width~{width}"
SWEEP_N_SHARDS = -(-SWEEP["n_seeds"] // SWEEP["shard_size"])


def sweep_shard_tables():
    """Every shard table of the configured sweep."""
    return expand(
        f"{SWEEP_DIR}/shards/{SWEEP_CELL}/shard~{{shard}}.csv",
        method=SWEEP["methods"],
        rank=SWEEP["teacher_ranks"],
        width=SWEEP["student_widths"],
        shard=range(SWEEP_N_SHARDS),
    )


def sweep_seed_range(wildcards):
    """START:STOP of the shard's seeds."""
    start = int(wildcards.shard) * SWEEP["shard_size"]
    return f"{start}:{min(start + SWEEP['shard_size'], SWEEP['n_seeds'])}"


def sweep_settings(wildcards):
    """Only what the method's results depend on, so other changes keep its shards."""
    return results_json(
        "sweep", {"data": SWEEP["data"], wildcards.method: SWEEP[wildcards.method]}
    )
