"""Teacher-student seed sweeps: one job per (method, teacher rank, student width, seed shard)."""


include: "sweep_helpers.smk"


FAMILY_TARGETS["sweep"] = lambda: final_outputs(
    rules.sweep_aggregate, rules.sweep_figures, rules.sweep_tables
)


localrules:
    sweep_tables,
    sweep_aggregate,


rule sweep_shard:
    output:
        table=f"{SWEEP_DIR}/shards/{SWEEP_CELL}/shard~{{shard}}.csv",
        run=f"{SWEEP_DIR}/shards/{SWEEP_CELL}/shard~{{shard}}.run.json",
    log:
        f"{SWEEP_DIR}/logs/{SWEEP_CELL}/shard~{{shard}}.log",
    benchmark:
        f"{SWEEP_DIR}/benchmarks/{SWEEP_CELL}/shard~{{shard}}.tsv"
    wildcard_constraints:
        method="gd|gnc",
        rank=r"\d+",
        width=r"\d+",
        shard=r"\d+",
    conda:
        CONDA_ENV
    resources:
        **rule_resources("sweep", "sweep_shard"),
    params:
        seeds=sweep_seed_range,
        settings=sweep_settings,
    shell:
        "GPUFLOW_GPUS={resources.gpu} gpuflow sweep-shard --method {wildcards.method} --teacher-rank {wildcards.rank}"
        " --student-width {wildcards.width} --seeds {params.seeds} --settings {params.settings}"
        " --runtime {resources.runtime_settings}"
        " --out {output.table:q} --run-out {output.run:q} > {log:q} 2>&1"


rule sweep_aggregate:
    input:
        shards=sweep_shard_tables(),
    output:
        table=f"{SWEEP_DIR}/table.csv",
        summary=report(
            f"{SWEEP_DIR}/summary.csv",
            caption="../report/sweep_summary.rst",
            category="Seed sweeps",
            labels={"figure": "summary table"},
        ),
    log:
        f"{SWEEP_DIR}/logs/aggregate.log",
    benchmark:
        f"{SWEEP_DIR}/benchmarks/aggregate.tsv"
    conda:
        CONDA_ENV
    resources:
        **rule_resources("sweep", "sweep_aggregate"),
    shell:
        "gpuflow sweep-aggregate --shards {input.shards:q} --out {output.table:q}"
        " --out-summary {output.summary:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"


rule sweep_figures:
    input:
        table=f"{SWEEP_DIR}/table.csv",
    output:
        test_error=report(
            f"{SWEEP_DIR}/figures/test_error.png",
            caption="../report/sweep_test_error.rst",
            category="Seed sweeps",
            labels={"figure": "test error vs student width"},
        ),
        guesses=report(
            f"{SWEEP_DIR}/figures/guesses.png",
            caption="../report/sweep_guesses.rst",
            category="Seed sweeps",
            labels={"figure": "guesses needed"},
        ),
    log:
        f"{SWEEP_DIR}/logs/figures.log",
    benchmark:
        f"{SWEEP_DIR}/benchmarks/figures.tsv"
    conda:
        CONDA_ENV
    resources:
        **rule_resources("sweep", "sweep_figures"),
    shell:
        "gpuflow sweep-figures --table {input.table:q} --out-test-error {output.test_error:q}"
        " --out-guesses {output.guesses:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"


rule sweep_tables:
    input:
        summary=f"{SWEEP_DIR}/summary.csv",
    output:
        tables=report(
            f"{SWEEP_DIR}/tables.html",
            caption="../report/sweep_tables.rst",
            category="Seed sweeps",
            labels={"figure": "summary tables"},
        ),
    log:
        f"{SWEEP_DIR}/logs/tables.log",
    conda:
        CONDA_ENV
    resources:
        runtime_settings=job_json("runtime"),
    shell:
        "gpuflow report-tables --csv {input:q} --title 'Seed sweeps: summary tables'"
        " --out {output.tables:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"
