"""`gpuflow status`: how far a run is and what went wrong, read from files and SLURM's commands."""
