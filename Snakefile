"""gpuflow: a research group's GPU experiments as one Snakemake workflow.

Rules are thin: each calls `gpuflow <step>`, which runs the same by hand. See README.md.
"""

from snakemake.utils import min_version

from gpuflow.config import validate_config

min_version("9.0")


configfile: "config/config.yaml"


validate_config(config, f"{workflow.basedir}/workflow/schemas/config.schema.yaml")


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/fluency.smk"
include: "workflow/rules/ssvae.smk"
include: "workflow/rules/scaling.smk"
include: "workflow/rules/sweep.smk"


onstart:
    run_startup_checks()


rule all:
    default_target: True
    input:
        all_targets,
