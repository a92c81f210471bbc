"""gpuflow.job: what every step's lifecycle shares (see each module)."""
