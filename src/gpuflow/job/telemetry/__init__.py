"""Telemetry of every job: a sampler thread reads the job's GPUs (NVML) and its process tree."""
