"""The run's timeline: every job's attempts over time, drawn once every other job has ended."""


include: "timeline_helpers.smk"


localrules:
    timeline,


# Its inputs are every family's final targets, so it runs after every other job of the run, and
# again only when one of those outputs changes (their job records are read, not inputs).
rule timeline:
    input:
        all_targets,
    output:
        figure=report(
            TIMELINE,
            caption="../report/timeline.rst",
            category="Run",
            labels={"figure": "jobs over time"},
        ),
        table=f"{TIMELINE_DIR}/attempts.csv",
    log:
        f"{TIMELINE_DIR}/logs/timeline.log",
    conda:
        CONDA_ENV
    resources:
        runtime_settings=job_json("runtime"),
    params:
        rules=lambda wildcards: rule_output_patterns(),
    shell:
        "gpuflow timeline --results results --rules {params.rules} --out {output.figure:q}"
        " --out-table {output.table:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"
