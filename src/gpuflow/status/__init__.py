"""`gpuflow status`: how far a run is and what went wrong, read from files and SLURM's commands.

No daemon and no database: the jobs come from the DAG Snakemake would build (`gpuflow.plan`),
their states from Snakemake's own records in `.snakemake/` (incomplete markers, metadata, the
latest run log), the output locks of `gpuflow.outputlock`, and `squeue` / `sacct`; the progress
of a running job from its job's progress file (gpuflow.job.progress).
"""
