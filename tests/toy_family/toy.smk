"""The toy family: a seeded Monte Carlo estimate of pi (tests/test_new_family.py)."""


include: "toy_helpers.smk"


if "toy" in config["families"]:
    toy_check()


FAMILY_TARGETS["toy"] = lambda: final_outputs(rules.toy_estimate)


rule toy_estimate:
    output:
        table=f"{TOY_DIR}/estimate.csv",
    log:
        f"{TOY_DIR}/logs/estimate.log",
    benchmark:
        f"{TOY_DIR}/benchmarks/estimate.tsv"
    conda:
        CONDA_ENV
    resources:
        **rule_resources("toy", "toy_estimate"),
    params:
        settings=results_json("toy", TOY),
    shell:
        "gpuflow toy-estimate --settings {params.settings} --runtime {resources.runtime_settings}"
        " --out {output.table:q} > {log:q} 2>&1"
