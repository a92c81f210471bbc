"""gpuflow on SLURM: the jobs squeue and sacct list (`queue`), the site file (`site`), and the
refusal to start while an earlier run's jobs still work on the targets (`earlier_jobs`)."""
