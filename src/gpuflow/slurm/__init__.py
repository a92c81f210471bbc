"""gpuflow on SLURM: squeue and sacct's jobs, the site file, and the earlier-jobs refusal."""
