"""gpuflow: the package behind the gpuflow Snakemake workflow; every step is `gpuflow <step>`."""

__version__ = "0.1.0"
