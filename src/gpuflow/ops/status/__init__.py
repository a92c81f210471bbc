"""`gpuflow status`: how far a run is and what went wrong, read from files and SLURM's commands.

No daemon of its own: the jobs come from the DAG Snakemake would build (`gpuflow.ops.plan`), their
states from Snakemake's records read through `gpuflow.ops.snakemake_adapter` (incomplete markers,
recorded times and the run's lock under either persistence backend, the latest run log), the
output locks of `gpuflow.job.outputlock`, and `squeue` / `sacct`; the progress of a running job from
its progress file.
"""
