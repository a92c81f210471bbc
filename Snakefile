"""gpuflow: a research group's GPU experiments as one Snakemake workflow.

Rules are thin: each calls `gpuflow <step>`, which runs the same by hand. See README.md.
"""

import os

from snakemake.utils import min_version

from gpuflow.settings.validate import validate_config
from gpuflow.settings.files import check_config_files

# What gpuflow requires (pyproject.toml: snakemake>=9.27.1,<9.28; the 9.27 internals that
# gpuflow.ops.snakemake_adapter reads, SUPPORTED).
min_version("9.27.1")

# The default config, read from the working directory as Snakemake reads `configfile:` (under
# --directory DIR: DIR/config/config.yaml where DIR has one; elsewhere the --configfile files
# over the schema's defaults). Snakemake has read --configfile files already; read them again
# strictly (repeated keys, NaN/inf, not UTF-8), and the default one before the directive does.
DEFAULT_CONFIG = "config/config.yaml"
check_config_files([*filter(os.path.isfile, [DEFAULT_CONFIG]), *workflow.configfiles])


configfile: DEFAULT_CONFIG


validate_config(config)


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/fluency.smk"
include: "workflow/rules/ssvae.smk"
include: "workflow/rules/scaling.smk"
include: "workflow/rules/sweep.smk"
include: "workflow/rules/timeline.smk"


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
        TIMELINE,
