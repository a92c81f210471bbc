"""Telemetry of every job: a sampler thread reads the job's GPUs (NVML) and its process tree.

`gpuflow.cli` starts it around each step (`job.job_telemetry`); the step's run record
(`gpuflow.job.devices.run_record`) holds the summary so far, and `<first output>.telemetry.json`
the final one. Reports and `gpuflow plan` read those files (`tables`), flagging jobs whose
utilisation is below the configured threshold with the reason their own timings give (`flags`).
"""
