"""Fluency-toxicity analysis: perplexity and toxicity per text, their correlation, a report."""


include: "fluency_helpers.smk"


if "fluency" in config["families"]:
    if FLUENCY["lm"]["path"] is None:
        check_heads(FLUENCY["lm"]["train"])
    else:
        STARTUP_CHECKS.append(
            lambda: check_model_reference("fluency.lm.path", FLUENCY["lm"]["path"])
        )
    if FLUENCY["toxicity"]["scorer"] == "huggingface":
        if FLUENCY["toxicity"]["model_path"] is None:
            raise WorkflowError(
                "config key 'fluency.toxicity.model_path': required when scorer is 'huggingface'"
            )
        STARTUP_CHECKS.append(
            lambda: check_model_reference(
                "fluency.toxicity.model_path", FLUENCY["toxicity"]["model_path"]
            )
        )
    if FLUENCY["texts"]["source"] == "files":
        check_group_columns(FLUENCY["texts"]["group_columns"])
        if not FLUENCY["texts"]["files"]:
            raise WorkflowError(
                "config key 'fluency.texts.files': empty, but source is 'files' (expected text files)"
            )
        STARTUP_CHECKS.append(
            lambda: check_files_exist("fluency.texts.files", FLUENCY["texts"]["files"])
        )

FAMILY_TARGETS["fluency"] = lambda: final_outputs(
    rules.fluency_figures, rules.fluency_report, rules.fluency_tables
)


localrules:
    fluency_tables,
    fluency_split,
    fluency_merge,
    fluency_report,


rule fluency_texts:
    output:
        texts=f"{FLUENCY_DIR}/texts.csv",
    log:
        f"{FLUENCY_DIR}/logs/texts.log",
    benchmark:
        f"{FLUENCY_DIR}/benchmarks/texts.tsv"
    conda:
        CONDA_ENV
    resources:
        **rule_resources("fluency", "fluency_texts"),
    params:
        settings=results_json("fluency", {"texts": FLUENCY["texts"]}),
    shell:
        "gpuflow fluency-texts --settings {params.settings} --out {output.texts:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"


rule fluency_train_lm:
    input:
        scored=f"{FLUENCY_DIR}/texts.csv",
    output:
        model=directory(f"{FLUENCY_DIR}/lm"),
    log:
        f"{FLUENCY_DIR}/logs/train_lm.log",
    benchmark:
        f"{FLUENCY_DIR}/benchmarks/train_lm.tsv"
    conda:
        CONDA_ENV
    threads: rule_cpus("fluency", "fluency_train_lm")
    resources:
        **rule_resources("fluency", "fluency_train_lm"),
    params:
        train=as_json(FLUENCY["lm"]["train"]),
    shell:
        "gpuflow fluency-train-lm --exclude {input.scored:q} --settings {params.train}"
        " --out {output.model:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"


rule fluency_split:
    input:
        texts=f"{FLUENCY_DIR}/texts.csv",
    output:
        shards=expand(f"{FLUENCY_DIR}/shards/shard~{{shard}}.csv", shard=FLUENCY_SHARDS),
    log:
        f"{FLUENCY_DIR}/logs/split.log",
    conda:
        CONDA_ENV
    resources:
        runtime_settings=job_json("runtime"),
    shell:
        "gpuflow fluency-split --texts {input.texts:q} --out {output.shards:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"


rule fluency_perplexity:
    input:
        texts=f"{FLUENCY_DIR}/shards/shard~{{shard}}.csv",
        embedded_lm=fluency_embedded_lm(),
    output:
        scores=f"{FLUENCY_DIR}/perplexity/shard~{{shard}}.csv",
        run=f"{FLUENCY_DIR}/perplexity/shard~{{shard}}.run.json",
    log:
        f"{FLUENCY_DIR}/logs/perplexity/shard~{{shard}}.log",
    benchmark:
        f"{FLUENCY_DIR}/benchmarks/perplexity/shard~{{shard}}.tsv"
    conda:
        CONDA_ENV
    threads: rule_cpus("fluency", "fluency_perplexity")
    resources:
        **rule_resources("fluency", "fluency_perplexity"),
    params:
        model=fluency_model_param,
        settings=results_json("fluency", {"perplexity": FLUENCY["perplexity"]}),
    shell:
        "GPUFLOW_GPUS={resources.gpu} gpuflow perplexity --texts {input.texts:q} --model {params.model:q}"
        " --settings {params.settings} --runtime {resources.runtime_settings}"
        " --out {output.scores:q} > {log:q} 2>&1"


rule fluency_toxicity:
    input:
        texts=f"{FLUENCY_DIR}/shards/shard~{{shard}}.csv",
    output:
        scores=f"{FLUENCY_DIR}/toxicity/shard~{{shard}}.csv",
        run=f"{FLUENCY_DIR}/toxicity/shard~{{shard}}.run.json",
    log:
        f"{FLUENCY_DIR}/logs/toxicity/shard~{{shard}}.log",
    benchmark:
        f"{FLUENCY_DIR}/benchmarks/toxicity/shard~{{shard}}.tsv"
    conda:
        CONDA_ENV
    resources:
        **rule_resources("fluency", "fluency_toxicity"),
    params:
        settings=results_json("fluency", {"toxicity": FLUENCY["toxicity"]}),
    shell:
        "GPUFLOW_GPUS={resources.gpu} gpuflow toxicity --texts {input.texts:q}"
        " --settings {params.settings} --runtime {resources.runtime_settings}"
        " --out {output.scores:q} > {log:q} 2>&1"


rule fluency_merge:
    input:
        texts=f"{FLUENCY_DIR}/texts.csv",
        perplexity=expand(
            f"{FLUENCY_DIR}/perplexity/shard~{{shard}}.csv", shard=FLUENCY_SHARDS
        ),
        toxicity=expand(
            f"{FLUENCY_DIR}/toxicity/shard~{{shard}}.csv", shard=FLUENCY_SHARDS
        ),
    output:
        scores=f"{FLUENCY_DIR}/scores.csv",
        summary=f"{FLUENCY_DIR}/perplexity_summary.json",
    log:
        f"{FLUENCY_DIR}/logs/merge.log",
    conda:
        CONDA_ENV
    resources:
        runtime_settings=job_json("runtime"),
    params:
        groups=quoted(fluency_group_columns()),
        model=shlex.quote(fluency_model()),
    shell:
        "gpuflow fluency-merge --texts {input.texts:q} --perplexity {input.perplexity:q}"
        " --toxicity {input.toxicity:q} --group-columns {params.groups} --model-name {params.model}"
        " --out {output.scores:q} --out-summary {output.summary:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"


rule fluency_stats:
    input:
        scores=f"{FLUENCY_DIR}/scores.csv",
    output:
        correlations=f"{FLUENCY_DIR}/stats/correlations.csv",
        correlations_json=f"{FLUENCY_DIR}/stats/correlations.json",
        binned=f"{FLUENCY_DIR}/stats/binned.csv",
    log:
        f"{FLUENCY_DIR}/logs/stats.log",
    benchmark:
        f"{FLUENCY_DIR}/benchmarks/stats.tsv"
    conda:
        CONDA_ENV
    resources:
        **rule_resources("fluency", "fluency_stats"),
    params:
        groups=quoted(fluency_group_columns()),
        stats=as_json(FLUENCY["stats"]),
    shell:
        "gpuflow fluency-stats --scores {input.scores:q} --group-columns {params.groups}"
        " --settings {params.stats} --out-correlations {output.correlations:q}"
        " --out-json {output.correlations_json:q} --out-binned {output.binned:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"


rule fluency_figures:
    input:
        scores=f"{FLUENCY_DIR}/scores.csv",
        binned=f"{FLUENCY_DIR}/stats/binned.csv",
    output:
        scatter=report(
            f"{FLUENCY_DIR}/figures/logppl_vs_toxicity.png",
            caption="../report/fluency_scatter.rst",
            category="Fluency-toxicity",
            labels={"figure": "log-perplexity vs toxicity"},
        ),
        binned=report(
            f"{FLUENCY_DIR}/figures/binned_means.png",
            caption="../report/fluency_binned.rst",
            category="Fluency-toxicity",
            labels={"figure": "binned means"},
        ),
        by_group=report(
            f"{FLUENCY_DIR}/figures/by_group.png",
            caption="../report/fluency_by_group.rst",
            category="Fluency-toxicity",
            labels={"figure": "per group"},
        ),
    log:
        f"{FLUENCY_DIR}/logs/figures.log",
    benchmark:
        f"{FLUENCY_DIR}/benchmarks/figures.tsv"
    conda:
        CONDA_ENV
    resources:
        **rule_resources("fluency", "fluency_figures"),
    params:
        groups=quoted(fluency_group_columns()),
    shell:
        "gpuflow fluency-figures --scores {input.scores:q} --binned {input.binned:q}"
        " --group-columns {params.groups} --out-scatter {output.scatter:q}"
        " --out-binned {output.binned:q} --out-by-group {output.by_group:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"


rule fluency_report:
    input:
        summary=f"{FLUENCY_DIR}/perplexity_summary.json",
        correlations=f"{FLUENCY_DIR}/stats/correlations.csv",
        binned=f"{FLUENCY_DIR}/stats/binned.csv",
    output:
        report=report(
            f"{FLUENCY_DIR}/summary.md",
            caption="../report/fluency_summary.rst",
            category="Fluency-toxicity",
            labels={"figure": "summary"},
        ),
    log:
        f"{FLUENCY_DIR}/logs/report.log",
    conda:
        CONDA_ENV
    resources:
        runtime_settings=job_json("runtime"),
    params:
        settings=job_json("results"),
    shell:
        "gpuflow fluency-report --summary {input.summary:q}"
        " --correlations {input.correlations:q} --binned {input.binned:q}"
        " --settings {params.settings}"
        " --out {output.report:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"


rule fluency_tables:
    input:
        correlations=f"{FLUENCY_DIR}/stats/correlations.csv",
        binned=f"{FLUENCY_DIR}/stats/binned.csv",
    output:
        tables=report(
            f"{FLUENCY_DIR}/tables.html",
            caption="../report/fluency_tables.rst",
            category="Fluency-toxicity",
            labels={"figure": "summary tables"},
        ),
    log:
        f"{FLUENCY_DIR}/logs/tables.log",
    conda:
        CONDA_ENV
    resources:
        runtime_settings=job_json("runtime"),
    shell:
        "gpuflow report-tables --csv {input:q} --title 'Fluency-toxicity: summary tables'"
        " --out {output.tables:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"
