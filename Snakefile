"""gpuflow: a research group's GPU experiments as one Snakemake workflow.

Rules are thin: each calls `gpuflow <step>`, which runs the same by hand. See README.md.
"""

from snakemake.utils import min_version

from gpuflow.settings.validate import validate_config
from gpuflow.settings.files import check_config_files

min_version("9.0")

# Snakemake has read --configfile files already; read them again strictly (repeated keys,
# NaN/inf, not UTF-8) and the default one before the `configfile:` directive reads it.
check_config_files([f"{workflow.basedir}/config/config.yaml", *workflow.configfiles])


configfile: "config/config.yaml"


validate_config(config)


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/fluency.smk"
include: "workflow/rules/ssvae.smk"
include: "workflow/rules/scaling.smk"
include: "workflow/rules/sweep.smk"


onstart:
    run_startup_checks()


onsuccess:
    clean_finished_states()


onerror:
    clean_finished_states()


rule all:
    default_target: True
    input:
        all_targets,
